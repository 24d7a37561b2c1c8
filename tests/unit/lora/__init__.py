"""Adapter loading and the registry (ids, scales, mixes, cache keys)."""
