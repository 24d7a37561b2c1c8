"""The sampler chain and per-request sampling."""
