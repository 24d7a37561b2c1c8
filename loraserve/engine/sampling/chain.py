"""Batched token sampling with llama-server's semantics.

Per row, llama.cpp's default server chain restricted to the samplers we support:
logit_bias (+ ignore_eos) -> penalties -> top_k -> top_p -> min_p -> temperature -> draw.
Like llama.cpp, top_p and min_p see the logits *before* temperature.

Determinism: every request owns a CPU `torch.Generator` and draws exactly one uniform per
step when its temperature is > 0 (none when greedy). What a row's draw depends on is its own
logits: batch-mates only add candidate columns that are -inf for it (exact zeros of mass),
and masses are accumulated per row in float64, so a seeded request produces the same tokens
whatever else shares its batch (barring last-bit float64 effects at a decision boundary).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraserve.engine.sampling.ops import (
    biased_argmax,
    fast_argmax,
    fast_topk,
    row_logsumexp,
    row_sum,
)
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.sampling.state import SamplerState

_TOP_P_PROBE = 1024  # candidates tried before a full sort when top_k is off and top_p is on
_F32_MAX = torch.finfo(torch.float32).max


@dataclass
class SampleResult:
    """One sampled token, and its probabilities when the request asked for ``n_probs``.

    ``probs``: up to ``n_probs`` (token, probability) pairs, sorted by probability, descending;
    ``prob``: the sampled token's probability in the same distribution. Which distribution
    follows llama-server (``populate_token_probs``): by default the softmax of the raw model
    logits, before logit_bias, penalties, samplers and temperature (exactly ``min(n_probs,
    vocab)`` entries); with ``post_sampling_probs`` the distribution the token was drawn
    from, after the whole chain, zero-probability entries dropped (so possibly fewer).
    Both are None when ``n_probs == 0``.
    """

    token: int
    probs: list[tuple[int, float]] | None = None
    prob: float | None = None


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


@dataclass
class _Group:
    """Rows sampled together: their final distributions over candidate tokens."""

    rows: list[int]
    ids: torch.Tensor | None  # [R, K] int64 token ids; None: K == vocab, column = token id
    probs: torch.Tensor  # [R, K] float64, sums to 1 per row
    cum: torch.Tensor  # [R, K] float64, running sum of unnormalised masses


def _filter(
    vals: torch.Tensor, params: list[SamplingParams], total: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """top_p (vals sorted desc), min_p, temperature over candidates -> final probs.

    vals [R, K] float32 logits, -inf = removed; total [R] float64: sum of exp(logit - max)
    over the row's full candidate set when vals holds only a prefix of it. Returns
    (probs [R, K] float64, cum [R, K] float64 unnormalised running mass).
    """
    dev = vals.device
    top = vals[:, :1]  # [R, 1]
    top_p = [p.top_p for p in params]
    if any(p < 1.0 for p in top_p):
        mass = torch.exp((vals - top).double())  # [R, K]
        cum = mass.cumsum(-1)
        if total is None:
            total = cum[:, -1]
        before = torch.nn.functional.pad(cum[:, :-1], (1, 0))  # mass strictly before column
        limit = torch.tensor(top_p, dtype=torch.float64, device=dev) * total  # [R]
        drop = (before >= limit[:, None]) & (limit < total)[:, None]
        vals = vals.masked_fill(drop, -math.inf)
    min_p = [p.min_p for p in params]
    if any(p > 0.0 for p in min_p):
        log_min_p = [math.log(p) if p > 0.0 else -math.inf for p in min_p]
        floor = vals.amax(-1) + torch.tensor(log_min_p, dtype=torch.float32, device=dev)  # [R]
        vals = vals.masked_fill(vals < floor[:, None], -math.inf)
    temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)  # [R]
    vals = (vals / temp[:, None]).clamp(max=_F32_MAX)
    mass = torch.exp((vals - vals.amax(-1, keepdim=True)).double())  # [R, K]
    cum = mass.cumsum(-1)
    if not bool(torch.isfinite(cum[:, -1]).all()):
        # Every candidate banned or non-finite logits: fall back to the first candidate.
        bad = ~torch.isfinite(cum[:, -1])
        mass[bad] = 0.0
        mass[bad, 0] = 1.0
        cum = mass.cumsum(-1)
    probs = mass / cum[:, -1:]
    return probs, cum


def _rows_of(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """x [B, V] -> x[rows] [R, V], without a copy when rows are all of x in order."""
    return x if rows == list(range(x.shape[0])) else x[torch.tensor(rows, device=x.device)]


def _sampled_groups(
    x: torch.Tensor, states: Sequence[SamplerState], rows: list[int]
) -> list[_Group]:
    """Run the chain on the non-greedy rows, vectorised over rows whose candidates are found
    the same way: top_k set (top-k), top_k off with top_p on (a sorted prefix), neither (the
    whole vocabulary, unsorted)."""
    vocab = x.shape[1]
    by_kind: dict[str, list[int]] = {"topk": [], "sorted": [], "full": []}
    for r in rows:
        p = states[r].params
        kind = "topk" if 0 < p.top_k < vocab else "sorted" if p.top_p < 1.0 else "full"
        by_kind[kind].append(r)
    groups = []

    def add(
        group_rows: list[int],
        vals: torch.Tensor,
        ids: torch.Tensor | None,
        total: torch.Tensor | None = None,
    ) -> None:
        probs, cum = _filter(vals, [states[r].params for r in group_rows], total)
        groups.append(_Group(group_rows, ids, probs, cum))

    if by_kind["topk"]:
        group_rows = by_kind["topk"]
        ks = [states[r].params.top_k for r in group_rows]
        vals, ids = fast_topk(_rows_of(x, group_rows), max(ks))  # [R, K] sorted desc
        if min(ks) < vals.shape[1]:
            cols = torch.arange(vals.shape[1], device=x.device)  # [K]
            k = torch.tensor(ks, device=x.device)  # [R]
            vals = vals.masked_fill(cols[None, :] >= k[:, None], -math.inf)
        add(group_rows, vals, ids)
    if by_kind["sorted"]:
        # top_p needs only a prefix of the sorted row: probe the top candidates, sort the
        # whole row only when their mass falls short (as llama.cpp does). `total` is the
        # same either way, so a row's cut never depends on the other rows.
        group_rows = by_kind["sorted"]
        xg = _rows_of(x, group_rows)  # [R, V]
        vals, ids = fast_topk(xg, min(vocab, _TOP_P_PROBE))  # [R, P]
        total = row_sum(torch.exp((xg - vals[:, :1]).double()))  # [R]
        reached = torch.exp((vals - vals[:, :1]).double()).cumsum(-1)[:, -1]  # [R]
        top_p = [states[r].params.top_p for r in group_rows]
        short = reached < torch.tensor(top_p, dtype=torch.float64, device=x.device) * total
        short = short.tolist()
        if not any(short):
            add(group_rows, vals, ids, total)
        else:
            keep = [i for i, s in enumerate(short) if not s]
            if keep:
                add([group_rows[i] for i in keep], vals[keep], ids[keep], total[keep])
            full = [i for i, s in enumerate(short) if s]
            vals, ids = torch.sort(xg[full], dim=-1, descending=True)  # [R', V]
            add([group_rows[i] for i in full], vals, ids, total[full])
    if by_kind["full"]:
        add(by_kind["full"], _rows_of(x, by_kind["full"]), None)
    return groups


def _token_ids(group: _Group, cols: torch.Tensor) -> torch.Tensor:
    """cols [R, n] candidate columns -> token ids [R, n]."""
    return cols if group.ids is None else group.ids.gather(1, cols)


def _uniform(generator: torch.Generator) -> float:
    """One draw in (0, 1]: a zero target would select a leading zero-probability token."""
    return 1.0 - torch.rand((), generator=generator, dtype=torch.float64).item()


def _draw(g: _Group, states: Sequence[SamplerState]) -> list[SampleResult]:
    """One token per row of the group, as llama.cpp's dist sampler: the first candidate whose
    running mass reaches u * total."""
    u = [_uniform(states[r].generator) for r in g.rows]
    target = torch.tensor(u, dtype=torch.float64, device=g.cum.device) * g.cum[:, -1]  # [R]
    cols = (g.cum < target[:, None]).sum(-1, keepdim=True)  # [R, 1]
    cols.clamp_(max=g.cum.shape[1] - 1)
    out = [SampleResult(t) for t in _token_ids(g, cols)[:, 0].tolist()]

    params = [states[r].params for r in g.rows]
    post = [p.n_probs if p.post_sampling_probs else 0 for p in params]
    if max(post):
        chosen = g.probs.gather(1, cols)[:, 0].tolist()
        top_probs, top_cols = fast_topk(g.probs, min(max(post), g.probs.shape[1]))  # [R, n]
        top_tokens = _token_ids(g, top_cols).tolist()
        for i, (res, n) in enumerate(zip(out, post, strict=True)):
            if n:
                pairs = zip(top_tokens[i][:n], top_probs[i].tolist(), strict=False)
                res.probs = [(t, p) for t, p in pairs if p > 0.0]
                res.prob = chosen[i]
    return out


def sample_batch(
    logits: torch.Tensor, states: Sequence[SamplerState], top: torch.Tensor | None = None
) -> list[SampleResult]:
    """Sample one token per row. logits [B, V] (row i belongs to states[i]); ``top`` [B]
    int64: each row's first maximum when the caller found it already (the step's finiteness
    pass, `kernels.rowops.scan_rows`, over these very values), else None.

    Rows may differ in every parameter. Greedy rows without penalties or n_probs (and with at
    most a bias of distinct tokens) are a single argmax over the batch; the others run the
    chain above, vectorised per group of rows that find their candidates the same way
    (top_k set; top_k off with top_p; neither).
    Does not call `SamplerState.accept`.
    """
    if logits.dim() != 2 or logits.shape[0] != len(states):
        raise ValueError(f"logits must be [len(states), vocab], got {tuple(logits.shape)}")
    if all(s.plain_greedy or s.bias_greedy for s in states):
        best = top if top is not None else fast_argmax(logits.contiguous())  # [B]
        tokens: list[int | None] = list(best.tolist())
        for r, s in enumerate(states):
            if s.bias_greedy:
                tokens[r] = biased_argmax(logits[r], tokens[r], s.bias_ids, s.bias_values)
        if None not in tokens:
            return [SampleResult(t) for t in tokens if t is not None]

    x = adjusted_logits(logits, states)  # [B, V] float32
    results = [SampleResult(-1) for _ in states]
    greedy = [r for r, s in enumerate(states) if s.params.greedy]
    if greedy:
        for r, t in zip(greedy, fast_argmax(_rows_of(x, greedy)).tolist(), strict=True):
            post = bool(states[r].params.n_probs and states[r].params.post_sampling_probs)
            results[r] = SampleResult(t, [(t, 1.0)] if post else None, 1.0 if post else None)
    sampled = [r for r, s in enumerate(states) if not s.params.greedy]
    for g in _sampled_groups(x, states, sampled):
        for r, res in zip(g.rows, _draw(g, states), strict=True):
            results[r] = res
    _add_raw_probs(logits, states, results)
    return results


def _add_raw_probs(
    logits: torch.Tensor, states: Sequence[SamplerState], results: list[SampleResult]
) -> None:
    """llama-server's default n_probs: softmax of the raw logits [B, V], top n per row."""
    rows = [
        r for r, s in enumerate(states) if s.params.n_probs and not s.params.post_sampling_probs
    ]
    if not rows:
        return
    raw = _rows_of(logits, rows).to(torch.float32).contiguous()  # [R, V]
    n = min(max(states[r].params.n_probs for r in rows), raw.shape[1])
    vals, ids = fast_topk(raw, n)  # [R, n]
    lse = row_logsumexp(raw)  # [R, 1]
    chosen_ids = torch.tensor([[results[r].token] for r in rows], device=raw.device)  # [R, 1]
    chosen = torch.exp(raw.gather(1, chosen_ids) - lse)[:, 0].tolist()
    probs, ids_l = torch.exp(vals - lse).tolist(), ids.tolist()
    for i, r in enumerate(rows):
        k = states[r].params.n_probs
        results[r].probs = list(zip(ids_l[i][:k], probs[i][:k], strict=True))
        results[r].prob = chosen[i]
