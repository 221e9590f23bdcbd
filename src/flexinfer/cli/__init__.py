"""Command-line interface: argument parsing only; each subcommand is a module in this package."""
