"""The child processes' side: their entry point and the reference, candidate and build roles."""
