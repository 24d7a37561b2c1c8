"""KV cache: the block pool and the prefix index keyed by adapter configuration."""
