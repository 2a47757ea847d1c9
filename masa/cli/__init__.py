"""The `masa` command line. Subcommand modules are imported only when chosen."""
