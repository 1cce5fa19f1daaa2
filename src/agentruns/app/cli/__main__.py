from agentruns.app.cli.main import main

main()
