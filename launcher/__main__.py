from launcher.cli import main

main()
