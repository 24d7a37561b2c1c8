"""Attention kinds over the paged KV pool (`paged`: grouped-query softmax attention, global,
sliding-window or chunked (llama4), rope or none, with logit soft-capping or sinks; `mla`:
multi-head latent attention over a compressed KV cache, deepseek2, with `heads`: its
per-head matrices in one grouped call), their q/k variants
(`variants`: partial rope, llama4's attention temperature) and rope frequency scaling
(`rope_scaling`: linear, YaRN, long rope factors); an architecture picks its kind per layer in
its `archs/` file."""

from loraserve.model.attn.paged import paged_attention

__all__ = ["paged_attention"]
