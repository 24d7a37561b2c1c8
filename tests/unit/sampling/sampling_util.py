"""Sampler states and random logits for the sampling tests, and the final distribution a state
gives a row of logits (the chain applied, the survivors' probabilities)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings

from loraserve.engine.sampling.chain import _sampled_groups, adjusted_logits
from loraserve.engine.sampling.ops import fast_argmax
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.sampling.state import SamplerState

PLAIN = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)  # no filtering at all


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def final_probs(logits_row: torch.Tensor, state: SamplerState) -> torch.Tensor:
    """The distribution `sample_batch` draws from for one row: logits [V] -> probs [V] float64.

    Greedy rows give a one-hot vector. Does not touch the state's generator.
    """
    x = adjusted_logits(logits_row[None, :], [state])  # [1, V]
    out = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)  # [V]
    if state.params.greedy:
        out[int(fast_argmax(x)[0])] = 1.0
        return out
    (g,) = _sampled_groups(x, [state], [0])
    if g.ids is None:
        return g.probs[0]
    return out.index_put_((g.ids[0],), g.probs[0], accumulate=True)


def state(prompt: tuple[int, ...] = (), eog: tuple[int, ...] = (), **kw: object) -> SamplerState:
    params = SamplingParams(**kw)  # type: ignore[arg-type]
    params.validate(1 << 20)
    return SamplerState(params, list(prompt), set(eog))


def randn(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale
