"""The programmatic composer: plans of up to five operators chained by shape inference, and
their task sources in the standard layout."""
