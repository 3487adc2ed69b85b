from crashbench.cli import main

main()
