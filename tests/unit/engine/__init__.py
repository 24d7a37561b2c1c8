"""The engine: scheduling, batching, prefix reuse, failure isolation, and the CLI over it."""
