"""What share of a prompt's prefill the recurrent scan is today (issue 28, chunked scans).

`python -m bench.chunked_profile [qwen35|granitehybrid|all] [--tokens 512] [--threads 1]
[--reps 2]` loads the `bench.hybrid_synth` model in-process (8 layers of qwen35's
shapes, 10 of granitehybrid's), runs one request of a `--tokens` prompt and one generated
token (cache off) after a warm-up, and prints the calling thread's CPU time of the whole
request and, inside it, the scan kernels (`gdn_recur`, `scan2`), the recurrent mixers
(projections, conv, gates, norm included), the quantized projections and the layers:
compare at `--threads 1` (the kernels' other threads are not counted). The request's wall
time is printed too (from 00:10 under `flock /tmp/loraserve-bench.lock`, e.g. at
`--threads 2`). The scan's share scales to the real models as the recurrent layers' share
of the layers does (qwen35: 24 of 32 as here 6 of 8; Granite 4.0 H 1B: 36 of 40 as here 9
of 10), the output projection aside. First it prints the prompt tokens
`bench.hybrid_speed`'s multi-turn chat recomputes with the cache on (`chat_recompute`:
today's 477, as measured in b5742b8, and with prefill-made states only).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from bench.hybrid_profile import instrument
from bench.hybrid_synth import REAL, synth_model
from bench.stage_profile import Meter


def prefill_profile(arch: str, tokens: int, threads: int, reps: int) -> list[dict[str, Any]]:
    """Per repetition: thread-CPU seconds of the whole request and of each label, calls, and
    the generated token."""
    from loraserve.engine.core import EngineConfig
    from loraserve.engine.engine import Engine
    from loraserve.engine.sampling.params import SamplingParams
    from loraserve.model.loader import load_model

    torch.set_num_threads(threads)
    m = load_model(synth_model(arch))
    meter = Meter()
    instrument(m.decoder, meter)
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=max(4096, 2 * tokens)))
    prompt = [(i * 7919) % 4000 + 4 for i in range(tokens)]
    out = []
    for r in range(reps + 1):
        meter.secs.clear()
        meter.calls.clear()
        t0, w0 = time.thread_time(), time.perf_counter()
        sub = eng.submit(prompts=[prompt], sampling=SamplingParams(temperature=0.0, n_probs=4),
                         max_tokens=1, cache_prompt=False)  # fmt: skip
        eng.run_until_idle()
        total, wall = time.thread_time() - t0, time.perf_counter() - w0
        events = [q.events.get_nowait() for q in sub.requests]
        if r:  # the first is the warm-up
            out.append({"total": total, "wall": wall, "secs": dict(meter.secs),
                        "calls": dict(meter.calls),
                        "token": (events[0].token, events[0].probs)})  # fmt: skip
    return out


def chat_recompute(
    decode_states: bool,
    keep_prompt_end: bool = False,
    system: int = 250,
    user: int = 37,
    answer: int = 40,
    turns: int = 5,
    bs: int = 16,
) -> list[int]:
    """Prompt tokens each request of `bench.hybrid_speed`'s chat recomputes (5 turns, then
    the last user message edited), from the states a scan can resume from: after every
    16-token block a step computes, the checkpoint 4 tokens before a prompt's end (as
    `StateStore.prepare` cuts them) and, with `keep_prompt_end`, the prompt's end; with
    `decode_states` also those decode steps make (the block ends and the live state at the
    last fed token, 8272bc9's next-turn resume). A chunked prefill beside a token-by-token
    decode may use only prefill-made states: a decode-made one has other bits than a
    cache-off prefill of the same tokens."""
    import random

    rng = random.Random(28)
    avail: list[tuple[list[int], int]] = []  # (tokens, position): a state after position

    def request(prompt: list[int]) -> tuple[int, list[int]]:
        ok = [p for toks, p in avail if p < len(prompt) and toks[:p] == prompt[:p]]
        start, n = max(ok, default=0), len(prompt)
        ans = [rng.randrange(4, 1000) for _ in range(answer)]
        made = [b for b in range(bs, n + 1, bs) if b > start] + [n - 4] * (n - 4 > start)
        made += [n] * keep_prompt_end
        if decode_states:  # fed: the answer's first answer - 1 tokens
            made += [b for b in range(bs, n + answer, bs) if b > n] + [n + answer - 1]
        avail.extend((prompt + ans, p) for p in made)
        return n - start, ans

    history, out, before_last = [rng.randrange(4, 1000) for _ in range(system)], [], []
    for _ in range(turns):
        before_last = list(history)
        prompt = history + [rng.randrange(4, 1000) for _ in range(user)]
        n, ans = request(prompt)
        out.append(n)
        history = prompt + ans
    out.append(request(before_last + [rng.randrange(4, 1000) for _ in range(user)])[0])
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.chunked_profile [ARCH|all] [--tokens N] [--threads N] [--reps N]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.chunked_profile", description=__doc__)
    ap.add_argument("arch", nargs="?", default="all", choices=[*REAL, "all"])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args(argv)
    for label, dec, end in (
        ("states from prefill and decode (today)", True, False),
        ("prefill states only", False, False),
        ("prefill states only, + each prompt's end", False, True),
    ):
        per = chat_recompute(dec, end)
        print(f"chat prompt tokens recomputed, {label}: {sum(per)} {per}")
    for arch in list(REAL) if args.arch == "all" else [args.arch]:
        reps = prefill_profile(arch, args.tokens, args.threads, args.reps)
        for i, rep in enumerate(reps):
            tot = rep["total"]
            print(f"{arch}: {args.tokens}-token prefill, "
                  f"repetition {i + 1}, {args.threads} thread(s): {tot * 1e3:.1f} ms thread "
                  f"CPU, {rep['wall'] * 1e3:.1f} ms wall; token, top-4 probs "
                  f"{rep['token']}")  # fmt: skip
            mm = sum(v for k, v in rep["secs"].items() if k.startswith("mm "))
            rows = [(k, v) for k, v in rep["secs"].items() if not k.startswith("mm ")]
            for label, secs in sorted([*rows, ("projections (all mm)", mm)], key=lambda r: -r[1]):
                calls = rep["calls"].get(label, "")
                print(f"  {label:28s} {secs * 1e3:9.1f} ms  {100 * secs / tot:5.1f}%  {calls}")


if __name__ == "__main__":
    main()
