"""One module per output format, each with render(summary, stream, ...)."""
