"""Attention kinds over the paged KV pool (`paged`: grouped-query softmax attention, global or
sliding-window, rope or none, with logit soft-capping or sinks; `mla`: multi-head latent
attention over a compressed KV cache, deepseek2); an architecture picks its kind per layer in
its `archs/` file."""

from loraserve.model.attn.paged import paged_attention

__all__ = ["paged_attention"]
