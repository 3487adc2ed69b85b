import sys

from crashbench.control.lazyfs.mount import main

main(sys.argv[1:])
