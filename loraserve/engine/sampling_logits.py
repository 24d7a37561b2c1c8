"""The sampler chain's first links, before any filtering: logit_bias (with ignore_eos) and
llama.cpp's repetition, frequency and presence penalties, batched over rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loraserve.engine.sampling_state import SamplerState


def adjusted_logits(logits: torch.Tensor, states: Sequence[SamplerState]) -> torch.Tensor:
    """The chain's first links, logit_bias (with ignore_eos) then penalties, as llama.cpp.

    logits [B, V] -> [B, V] float32 (the input itself when nothing changes; never modified).
    Penalties (llama.cpp's ``llama_sampler_penalties_apply``), for each distinct token of
    the window with count c: divide a positive logit by repeat_penalty, multiply a
    non-positive one, then subtract c * frequency_penalty + presence_penalty.
    """
    x = logits.to(torch.float32).contiguous()
    if not any(s.modifies_logits for s in states):
        return x
    if x.data_ptr() == logits.data_ptr():
        x = x.clone()
    dev = x.device
    biased = [(r, s) for r, s in enumerate(states) if s.bias_ids.numel()]
    if biased:
        rows = torch.cat([torch.full_like(s.bias_ids, r) for r, s in biased]).to(dev)  # [m]
        ids = torch.cat([s.bias_ids for _, s in biased]).to(dev)  # [m]
        values = torch.cat([s.bias_values for _, s in biased]).to(dev)  # [m]
        x.index_put_((rows, ids), values, accumulate=True)

    pen = [(r, s.params, *s.penalty_counts()) for r, s in enumerate(states) if s.penalized]
    if pen:
        lens = torch.tensor([len(t) for _, _, t, _ in pen])  # [P] distinct tokens per row

        def per_entry(values: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).repeat_interleave(lens).to(dev)  # [n]

        rows = per_entry([r for r, *_ in pen], torch.int64)
        ids = torch.cat([t for *_, t, _ in pen]).to(dev)  # [n], unique within a row
        counts = torch.cat([c for *_, c in pen]).to(dev)  # [n]
        repeat = per_entry([p.repeat_penalty for _, p, *_ in pen])
        freq = per_entry([p.frequency_penalty for _, p, *_ in pen])
        presence = per_entry([p.presence_penalty for _, p, *_ in pen])
        cur = x[rows, ids]  # [n]
        cur = torch.where(cur <= 0, cur * repeat, cur / repeat)
        x[rows, ids] = cur - (counts * freq + presence)
    return x
