from plangate.cli import main

main()
