from mosafs.cli import main

main()
