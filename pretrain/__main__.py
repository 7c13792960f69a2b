from pretrain.cli import main

main()
