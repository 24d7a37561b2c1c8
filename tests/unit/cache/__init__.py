"""The block pool and the prefix cache."""
