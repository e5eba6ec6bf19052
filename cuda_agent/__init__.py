"""The `cuda-agent` console command: one entry point with a subcommand per capability."""
