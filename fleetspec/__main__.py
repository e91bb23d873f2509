from fleetspec.cli import main

main()
