"""Chunked scans vs our token-by-token C scans (issue 28 items 1 and 3): accuracy and time.

`python -m bench.chunked_scan [--tokens 512] [--chunks 16,32,64] [--reps 3] [--wall]
[--threads N]` draws one prompt's scan inputs at the bench models' shapes
(`bench.hybrid_synth`: qwen35's delta-net, 32 value heads of S = 128; granitehybrid's Mamba-2,
48 heads of P = 64, state N = 128, one group), the way those files draw their decays, runs
our C kernels (`kernels.deltanet.gdn_recur`, `kernels.ssm_scan.scan2`) and the torch chunked
forms (`bench.chunked_forms`) on them, and prints each chunk size's max abs difference from
the C scan (outputs and final state, and the C scan's max abs output for scale) and each
form's time per prompt: the calling thread's CPU time by default (compare at `--threads 1`),
wall time with `--wall` (run it under `flock /tmp/loraserve-bench.lock`). Then the
prefix-consistency check (`bench.chunked_prefix`) at the same shapes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench.chunked_forms import gdn_chunked, ssd_chunked
from loraserve.model.recurrent.gdn_math import gate_row

GDN = {"hv": 32, "s": 128}  # qwen35 (Qwen3.5-4B): value heads, key = value head width
SSD = {"h": 48, "p": 64, "n": 128, "g": 1}  # granitehybrid (Granite-4.0-H-1B)


def _decays(gen: torch.Generator, t: int, h: int) -> tuple[torch.Tensor, ...]:
    """(raw [T, H], dt_bias [H], A [H]) drawn as `hybrid_synth` draws them: A = -exp(U(0,
    2.7)), dt_bias = softplus^-1(U(0.01, 0.1)), raw ~ N(0, 1); dt = softplus(raw + dt_bias)."""
    a = -torch.exp(torch.rand(h, generator=gen) * 2.7)
    dt_b = torch.log(torch.expm1(0.01 + 0.09 * torch.rand(h, generator=gen)))
    return torch.randn(t, h, generator=gen), dt_b, a


def gdn_inputs(t: int, seed: int = 0, hv: int = GDN["hv"], s: int = GDN["s"]) -> dict:
    """q, k [T, H, S] of unit L2 norm (as `GatedDeltaNet` feeds the kernel), v
    [T, H, S] SiLU-like, g = exp(dt A), beta = sigmoid(N(0, 1)) [T, H], M0 [H, S, S]."""
    gen = torch.Generator().manual_seed(seed)
    inv = 1.0 / math.sqrt(s)
    q, k = (F.normalize(torch.randn(t, hv, s, generator=gen), dim=-1) for _ in "qk")
    v = F.silu(torch.randn(t, hv, s, generator=gen))
    raw, dt_b, a = _decays(gen, t, hv)
    g, beta = gate_row(raw, torch.randn(t, hv, generator=gen), dt_b, a)  # the model's gates
    m0 = 0.1 * torch.randn(hv, s, s, generator=gen)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "scale": inv, "m0": m0}


def ssd_inputs(t: int, seed: int = 0, h: int = SSD["h"], p: int = SSD["p"], n: int = SSD["n"],
               g: int = SSD["g"]) -> dict:  # fmt: skip
    """xbc [T, H P + 2 G N] (x, B, C after the conv and SiLU), dt, da = exp(dt A) [T, H] and
    dt A, s0 [H, P, N]."""
    gen = torch.Generator().manual_seed(seed)
    xbc = F.silu(torch.randn(t, h * p + 2 * g * n, generator=gen))
    raw, dt_b, a = _decays(gen, t, h)
    dt = F.softplus(raw + dt_b)
    loga = dt * a
    s0 = 0.1 * torch.randn(h, p, n, generator=gen)
    return {"xbc": xbc, "dt": dt, "loga": loga, "da": torch.exp(loga), "s0": s0,
            "dims": (h, p, n, g)}  # fmt: skip


def gdn_c(d: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Our C recurrence on one sequence: -> (o [T, H, S], final M [H, S, S])."""
    from loraserve.kernels import deltanet

    t, hv, s = d["q"].shape
    o, m_out = torch.empty(t, hv, s), torch.empty(hv * s * s)
    deltanet.gdn_recur([(0, t)], [d["m0"].reshape(-1)], [m_out], d["q"], d["k"], d["v"],
                       d["g"], d["beta"], d["scale"], o, [[]])  # fmt: skip
    return o, m_out.view(hv, s, s)


def gdn_torch(d: dict, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked form (`chunked_forms.gdn_chunked`) on the same inputs."""
    return gdn_chunked(d["q"], d["k"], d["v"], d["g"], d["beta"], d["scale"], d["m0"], c)


def ssd_c(d: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Our C Mamba-2 scan on one sequence: -> (y [T, H, P], final s [H, P, N])."""
    from loraserve.kernels import ssm_scan

    t = d["xbc"].shape[0]
    y, fin, _ = ssm_scan.scan2(d["xbc"], d["dt"], d["da"], d["dims"], [(0, t)], [d["s0"]], [[]])
    return y, fin[0]


def ssd_torch(d: dict, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked SSD form (`chunked_forms.ssd_chunked`) on the same inputs."""
    h, p, n, g = d["dims"]
    t, xbc = d["xbc"].shape[0], d["xbc"]
    x = xbc[:, : h * p].view(t, h, p)
    bm = xbc[:, h * p : h * p + g * n].view(t, g, n)
    cm = xbc[:, h * p + g * n : h * p + 2 * g * n].view(t, g, n)
    return ssd_chunked(x, d["dt"], d["loga"], bm, cm, d["s0"], c)


def timed(fn: Callable[[], object], reps: int, wall: bool) -> float:
    """Median seconds of `fn` over `reps` runs after one warm-up (thread CPU or wall)."""
    clock = time.perf_counter if wall else time.thread_time
    fn()
    out = []
    for _ in range(reps):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return statistics.median(out)


def compare(name: str, d: dict, ref_fn: Callable, chunked_fn: Callable, chunks: list[int],
            reps: int, wall: bool) -> list[dict]:  # fmt: skip
    """Rows: the C scan's time, then per chunk size its time and max abs differences."""
    ref_o, ref_s = ref_fn(d)
    rows = [{"form": f"{name} recurrent C", "ms": 1e3 * timed(lambda: ref_fn(d), reps, wall),
             "max|o|": ref_o.abs().max().item(), "max|s|": ref_s.abs().max().item()}]  # fmt: skip
    for c in chunks:
        o, s = chunked_fn(d, c)
        rows.append({"form": f"{name} chunked torch C={c}",
                     "ms": 1e3 * timed(lambda c=c: chunked_fn(d, c), reps, wall),
                     "dmax o": (o - ref_o).abs().max().item(),
                     "dmax s": (s - ref_s).abs().max().item()})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.chunked_scan [--tokens N] [--chunks 16,32,64] [--wall]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.chunked_scan", description=__doc__)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--chunks", default="16,32,64")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall time (under the bench lock)")
    ap.add_argument("--no-prefix", action="store_true", help="skip the prefix-consistency check")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    chunks = [int(c) for c in args.chunks.split(",")]
    clock = "wall" if args.wall else "thread-CPU"
    print(f"{args.tokens}-token prompt, {args.threads} thread(s), {clock} ms (median of "
          f"{args.reps}); max abs differences vs the C scan")  # fmt: skip
    rows = compare("delta-net", gdn_inputs(args.tokens), gdn_c, gdn_torch, chunks, args.reps,
                   args.wall)  # fmt: skip
    rows += compare("mamba-2", ssd_inputs(args.tokens), ssd_c, ssd_torch, chunks, args.reps,
                    args.wall)  # fmt: skip
    for r in rows:
        rest = "  ".join(f"{k} {v:.3g}" for k, v in r.items() if k not in ("form", "ms"))
        print(f"  {r['form']:30s} {r['ms']:9.2f} ms  {rest}")
    if not args.no_prefix:
        from bench.chunked_prefix import report

        report(args.tokens)


if __name__ == "__main__":
    main()
