from agentruns.entrypoints.cli.main import main

main()
