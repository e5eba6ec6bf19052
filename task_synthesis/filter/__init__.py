"""The execution filter: every candidate task runs before it is kept, and each rejection has a reason."""
