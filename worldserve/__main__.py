from worldserve.cli import main

main()
