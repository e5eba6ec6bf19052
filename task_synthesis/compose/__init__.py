"""The composers: plans of up to five operators chained by shape inference, rendered as task sources
in the standard layout (programmatic) or written from the same plans by a model (LLM)."""
