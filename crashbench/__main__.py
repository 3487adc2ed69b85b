from crashbench.console import main

main()
