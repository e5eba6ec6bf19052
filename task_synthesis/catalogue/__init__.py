"""Seed operators: the shape families they fall into, the crawl of the installed torch, and
the transformers-style blocks written in plain torch."""
