"""Can a chunked scan keep the numerics contract? The prefix-consistency prototype.

The design: scan chunks are aligned to absolute positions (rows base, base + c, ...), and
between two steps of a sequence its scan state is `Carried`: the state at the last chunk
boundary it has passed plus the rows since (< c, "pending"). A step of n new rows puts the
pending rows back in front, cuts the rows at the same absolute boundaries as any other
chunking would, pads the last partial chunk with identity rows (decay 1, no input) to the
fixed shape [c, ...], and keeps only full chunks' end states. Every op then sees the same
shapes and the same values for rows <= i whatever the chunking, so row i's output and every
kept state are the same bits alone, batched, in any pieces, one row at a time (decode) or
resumed from a `Carried` snapshot; a partial chunk's rows are recomputed (< c rows of
state-free work) by the step that completes it. `check` verifies it with the torch chunked
forms (`bench.chunked_forms`), whose matrix products are MKL's: it holds there as long as a
product's row i does not depend on the other rows' values nor on the batch size (measured:
it holds; the C version would make it true by construction, each dot product summed in a
fixed order). `naive` shows what breaks without the alignment.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from bench.chunked_forms import gdn_intra, gdn_pass, ssd_intra, ssd_pass

Rows = tuple[torch.Tensor, ...]  # a form's per-row inputs, each [B, T, ...]


@dataclass
class Form:
    """A chunked scan: its state-free part over [B, c, ...] chunks and its state pass."""

    intra: Callable[..., tuple]
    step: Callable[[torch.Tensor, Rows, tuple], tuple[torch.Tensor, torch.Tensor]]


def gdn_form(scale: float) -> Form:
    """The gated delta rule; rows (q, k, v, log g, beta)."""
    return Form(gdn_intra, lambda st, rows, parts: gdn_pass(st, rows[0], rows[1], parts, scale))


SSD = Form(ssd_intra, lambda st, rows, parts: ssd_pass(st, parts))  # rows (x dt, B, C, dt A)


@dataclass
class Carried:
    """A sequence's scan state between steps: `state` [B, ...] at absolute row `base` (a
    multiple of c) and the `pending` rows base..base + r - 1 (r < c) after it."""

    base: int
    state: torch.Tensor
    pending: Rows


def start(state: torch.Tensor, rows: Rows) -> Carried:
    """A sequence at row 0 (`rows` only for the row shapes)."""
    return Carried(0, state, tuple(x[:, :0] for x in rows))


def _cut(rows: Rows, c: int) -> tuple[Rows, int]:
    """rows [B, L, ...] -> ([B nc, c, ...] zero-padded, nc)."""
    b, n = rows[0].shape[:2]
    nc = -(-n // c)
    out = []
    for x in rows:
        z = x.new_zeros(b, nc * c, *x.shape[2:])
        z[:, :n] = x
        out.append(z.view(b * nc, c, *x.shape[2:]))
    return tuple(out), nc


def steps(form: Form, seqs: Sequence[tuple[Carried, Rows]], c: int) -> list[tuple]:
    """One engine step over several sequences: each (carried, its new rows [B, n, ...]).
    The state-free parts of every chunk of every sequence run as one batch; the state
    passes per sequence. -> per sequence (out [B, n, ...] of its new rows, its new Carried)."""
    cut, where = [], []
    for carried, new in seqs:
        rows = tuple(torch.cat((p, x), dim=1) for p, x in zip(carried.pending, new, strict=True))
        chunks, nc = _cut(rows, c)
        where.append((rows, chunks, nc))
        cut.append(chunks)
    flat = tuple(torch.cat(parts) for parts in zip(*cut, strict=True))
    intra = form.intra(*flat)
    out, at = [], 0
    for (carried, new), (rows, chunks, nc) in zip(seqs, where, strict=True):
        b, n_all = rows[0].shape[:2]
        mine = tuple(x[at : at + b * nc].view(b, nc, *x.shape[1:]) for x in intra)
        at += b * nc
        ys, state = [], carried.state
        for j in range(nc):
            rows_j = tuple(x.view(b, nc, *x.shape[1:])[:, j] for x in chunks)
            y, s1 = form.step(state, rows_j, tuple(x[:, j] for x in mine))
            ys.append(y)
            if (j + 1) * c <= n_all:  # a full chunk: its end state is kept
                state = s1
        full = n_all // c * c
        r = carried.pending[0].shape[1]
        y = torch.cat(ys, dim=1)[:, r : r + new[0].shape[1]]
        out.append((y, Carried(carried.base + full, state, tuple(x[:, full:] for x in rows))))
    return out


def run_pieces(form: Form, s0: torch.Tensor, rows: Rows, cuts: list[int], c: int) -> tuple:
    """One sequence's rows in pieces ending at `cuts` (ascending, the last = T), one step
    each. -> (out [B, T, ...], final Carried)."""
    carried, outs, lo = start(s0, rows), [], 0
    for hi in cuts:
        [(y, carried)] = steps(form, [(carried, tuple(x[:, lo:hi] for x in rows))], c)
        outs.append(y)
        lo = hi
    return torch.cat(outs, dim=1), carried


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and the same bits (signed zeros told apart)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))  # fmt: skip


def same(x: tuple, y: tuple) -> bool:
    """Two (out, Carried) results bit for bit."""
    (oa, ca), (ob, cb) = x, y
    return (
        bits_equal(oa, ob)
        and ca.base == cb.base
        and bits_equal(ca.state, cb.state)
        and all(bits_equal(p, q) for p, q in zip(ca.pending, cb.pending, strict=True))
    )


def random_cuts(t: int, rng: random.Random, decode_tail: int = 0) -> list[int]:
    """Ascending piece ends for t rows: random prompt pieces, then `decode_tail` 1-row steps."""
    body = t - decode_tail
    cuts = sorted(rng.sample(range(1, body), k=min(4, body - 1))) + [body]
    return cuts + list(range(body + 1, t + 1))


def check(form: Form, s0: torch.Tensor, rows: Rows, other: tuple, c: int,
          trials: int = 3, seed: int = 0) -> dict[str, bool]:  # fmt: skip
    """Whether one sequence's outputs and final carried state are the same bits: in random
    pieces (mid-chunk ends, then decode steps) as in one piece; batched with `other`
    (s0, rows of another sequence, pieces of its own) as alone; at 1 and 2 threads."""
    t = rows[0].shape[1]
    whole = run_pieces(form, s0, rows, [t], c)
    rng = random.Random(seed)
    pieces = all(same(whole, run_pieces(form, s0, rows, random_cuts(t, rng, 8), c))
                 for _ in range(trials))  # fmt: skip
    s1, rows1 = other
    half, half1 = t // 2 + 3, rows1[0].shape[1] // 3
    a = steps(form, [(start(s0, rows), tuple(x[:, :half] for x in rows)),
                     (start(s1, rows1), tuple(x[:, :half1] for x in rows1))], c)  # fmt: skip
    b = steps(form, [(a[1][1], tuple(x[:, half1:] for x in rows1)),
                     (a[0][1], tuple(x[:, half:] for x in rows))], c)  # fmt: skip
    batched = same(whole, (torch.cat((a[0][0], b[1][0]), dim=1), b[1][1]))
    threads = torch.get_num_threads()
    torch.set_num_threads(2 if threads == 1 else 1)
    try:
        other_threads = same(whole, run_pieces(form, s0, rows, random_cuts(t, rng, 4), c))
    finally:
        torch.set_num_threads(threads)
    return {"pieces": pieces, "batched": batched, "threads": other_threads}


def naive(form: Form, s0: torch.Tensor, rows: Rows, cut: int, c: int) -> float:
    """Max abs difference of the outputs after `cut` when the second piece's chunks start at
    the cut (from the partial chunk's end state) instead of at absolute multiples of c."""
    t = rows[0].shape[1]
    whole, _ = run_pieces(form, s0, rows, [t], c)
    [(y0, c0)] = steps(form, [(start(s0, rows), tuple(x[:, :cut] for x in rows))], c)
    _, s_cut = form.step(
        c0.state, tuple(_cut(c0.pending, c)[0]), form.intra(*_cut(c0.pending, c)[0])
    )  # the partial chunk's state
    [(y1, _)] = steps(form, [(start(s_cut, rows), tuple(x[:, cut:] for x in rows))], c)
    return (torch.cat((y0, y1), dim=1) - whole).abs().max().item()


def gdn_rows(d: dict) -> tuple[torch.Tensor, Rows]:
    """`chunked_scan.gdn_inputs` as (M0 [H, S, S], rows [H, T, ...])."""
    rows = (d["q"], d["k"], d["v"], torch.log(d["g"]), d["beta"])
    return d["m0"], tuple(x.transpose(0, 1).contiguous() for x in rows)


def ssd_rows(d: dict) -> tuple[torch.Tensor, Rows]:
    """`chunked_scan.ssd_inputs` (one group) as (s0 [H, P, N], rows [H, T, ...])."""
    h, p, n, _ = d["dims"]
    t, xbc = d["xbc"].shape[0], d["xbc"]
    xdt = (xbc[:, : h * p].view(t, h, p) * d["dt"].unsqueeze(-1)).transpose(0, 1)
    b, cm = (xbc[:, h * p + i * n : h * p + (i + 1) * n].expand(h, t, n) for i in (0, 1))
    return d["s0"], (xdt.contiguous(), b.contiguous(), cm.contiguous(), d["loga"].t().contiguous())


def report(tokens: int, chunks: Sequence[int] = (16, 64)) -> None:
    """Prefix consistency at the bench shapes, the naive cut's error, and a decode step's
    cost in this form (a whole padded chunk per row) against the C kernels' one row."""
    import time

    from bench.chunked_scan import gdn_c, gdn_inputs, ssd_c, ssd_inputs

    t = min(tokens, 200)  # each check runs the prompt several times
    for name, inputs, to_rows, form_of, c_one in (
        ("delta-net", gdn_inputs, gdn_rows, lambda d: gdn_form(d["scale"]), gdn_c),
        ("mamba-2", ssd_inputs, ssd_rows, lambda d: SSD, ssd_c),
    ):
        d, d1 = inputs(t), inputs(t + 37, seed=1)
        s0, rows = to_rows(d)
        form = form_of(d)
        for c in chunks:
            ok = check(form, s0, rows, to_rows(d1), c, trials=2)
            cut = c + c // 2 + 1  # inside the second chunk (a prompt shorter: skipped)
            err = naive(form, s0, rows, cut, c) if cut < t else float("nan")
            per = float("nan") if c + 8 > t else 0.0
            for i in range(8 if c + 8 <= t else 0):  # decode steps at rows c + i, one row
                _, carried = run_pieces(form, s0, rows, [c + i], c)
                t0 = time.thread_time()
                steps(form, [(carried, tuple(x[:, c + i : c + i + 1] for x in rows))], c)
                per += (time.thread_time() - t0) / 8
            print(f"  {name} C={c}: same bits {ok}; chunks from the cut instead: max abs "
                  f"diff {err:.3g}; a decode row (a padded {c}-row chunk in torch) "
                  f"{per * 1e3:.2f} ms thread CPU")  # fmt: skip
        one = inputs(1)
        c_one(one)  # warm-up
        t0 = time.thread_time()
        for _ in range(20):
            c_one(one)
        print(f"  {name}: the C kernel's one decode row {(time.thread_time() - t0) / 20 * 1e3:.3f}"
              " ms thread CPU")  # fmt: skip
