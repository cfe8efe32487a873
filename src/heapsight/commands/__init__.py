"""One module per subcommand; each exposes add_arguments(parser) and execute(args)."""
