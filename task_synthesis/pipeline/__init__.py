"""A synthesis run: the journal that makes it resumable, the scheduler over worker processes, the outputs."""
