from checkpoints_tools.cli import main

main()
