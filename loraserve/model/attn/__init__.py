"""Attention kinds over the paged KV pool (`paged`: grouped-query softmax attention, global or
sliding-window, rope or none); an architecture picks its kind per layer in its `archs/` file."""

from loraserve.model.attn.paged import paged_attention

__all__ = ["paged_attention"]
