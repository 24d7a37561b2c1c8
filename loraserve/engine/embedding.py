"""Embedding requests: which rows of a prompt their pooling needs, and the pooling itself.

An embedding request (`Request.pooling` set) runs its prompt through the same scheduler,
slots, prefix cache and forward passes as a completion, under its own adapter mix, but is
never sampled: each prefill chunk asks the decoder for the final-norm hidden states of the
rows its pooling reads (`StepContext.hidden_rows`), and the request ends when its prompt is
done, with the pooled result on its final event. Pooling as llama.cpp's
(`llm_graph_context::build_pooling`): ``none`` every token's vector, ``mean`` their mean,
``cls`` the first token's, ``last`` the last one's; ``rank`` on a causal model without a
classification head is the last token's vector too (its first element is the score).

Only ``last`` and ``rank`` can reuse cached KV (the last prompt token is always evaluated);
the others need every row, so `Engine.submit` runs them with ``cache_prompt`` off.
"""

from __future__ import annotations

import torch

from loraserve.engine.pooling import Pooling as Pooling  # re-exported for importers


def wanted_rows(pooling: Pooling, start: int, n: int, n_prompt: int) -> tuple[int, int] | None:
    """Offsets ``(lo, hi)`` inside a chunk of positions ``start..start+n-1`` whose hidden
    states the pooling reads (None: none of them)."""
    if pooling in (Pooling.NONE, Pooling.MEAN):
        return (0, n)
    if pooling is Pooling.CLS:
        return (0, 1) if start == 0 else None
    return (n - 1, n) if start + n == n_prompt else None


class Pooler:
    """The pooled result of one request, fed chunk by chunk in position order."""

    def __init__(self, pooling: Pooling) -> None:
        self.pooling = pooling
        self._rows: list[torch.Tensor] = []  # NONE: every chunk's rows
        self._sum: torch.Tensor | None = None  # MEAN: float64 running sum
        self._n = 0
        self._one: torch.Tensor | None = None  # CLS, LAST, RANK

    def add(self, rows: torch.Tensor) -> None:
        """Rows [h, hidden] of the next chunk (those `wanted_rows` chose)."""
        if self.pooling is Pooling.NONE:
            self._rows.append(rows.float().clone())
        elif self.pooling is Pooling.MEAN:
            s = rows.double().sum(dim=0)
            self._sum = s if self._sum is None else self._sum + s
            self._n += rows.shape[0]
        elif rows.shape[0]:
            self._one = rows[-1].float().clone()

    def result(self) -> torch.Tensor:
        """[n_tokens, hidden] for ``none``, else [1, hidden] float32."""
        if self.pooling is Pooling.NONE:
            return torch.cat(self._rows) if self._rows else torch.empty(0)
        if self.pooling is Pooling.MEAN:
            assert self._sum is not None
            return (self._sum / max(self._n, 1)).float().unsqueeze(0)
        assert self._one is not None
        return self._one.unsqueeze(0)


def normalize(v: torch.Tensor, embd_normalize: int) -> torch.Tensor:
    """llama.cpp's `common_embd_normalize` on each row: -1 none, 0 max-abs scaled to the
    int16 range, 2 euclidean, p > 0 the p-norm."""
    x = v.double()
    if embd_normalize == -1:
        return v
    if embd_normalize == 0:
        norm = x.abs().amax(dim=-1, keepdim=True) / 32760.0
    elif embd_normalize == 2:
        norm = x.pow(2).sum(dim=-1, keepdim=True).sqrt()
    else:
        norm = x.abs().pow(embd_normalize).sum(dim=-1, keepdim=True).pow(1.0 / embd_normalize)
    inv = torch.where(norm > 0, 1.0 / norm, torch.zeros_like(norm))
    return (x * inv).float()
