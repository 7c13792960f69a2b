from downstream.cli import main

main()
