"""Thread-CPU cost of `bench.adapter_scale`'s loads, in process, at 1 thread:
`python -m bench.adapter_scale_profile [--adapters 8] [--requests 32] [--reps 3]`.

The real model and the bench's own adapter pool (`adapter_scale_pool`, rank 8 and 16
alternating, float16, all seven projections) loaded up front (no first-use reads in the
figures); 8 requests at a time (the bench's 8 clients, `-np 8`), each a distinct prompt of
the bench's length and 32 greedy tokens, cache off. Cases: no adapter, every request on
`a0000` (rank 8: the bench's reference), on `a0001` (rank 16), and the Zipf picks of the
bench's seeds over `--adapters` adapters. Prints each case's thread-CPU ms per generated
token (prefill included, as the bench's throughput has it) for every repetition, and the
Zipf cases over the rank-8 one: time.thread_time sees the one engine thread's work alone,
so a loaded machine disturbs it little (wall clock is for `bench.adapter_scale` under the
lock).

`--loads N`: instead, the thread-CPU of a first read of N pool adapters (`--reps` times
over the same files, each read a first one: no header handed over, no content id
remembered), the whole `lora.adapter.load_adapter` and its phases (header parse, the pairs
as views of the file with their header checks, the copy and value checks, the content
hash), medians for rank 8 and rank 16 apart. The files are read once before (page cache).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from bench.adapter_scale import MODEL, Plan, prompts
from bench.adapter_scale_pool import lora_dir
from bench.workloads import zipf_choices


def main(argv: list[str] | None = None) -> None:
    """Load the model and adapters, run the cases `--reps` times, print ms a token."""
    ap = argparse.ArgumentParser(prog="python -m bench.adapter_scale_profile",
                                 description=__doc__)  # fmt: skip
    ap.add_argument("--adapters", type=int, default=64, help="the Zipf pool's size")
    ap.add_argument("--requests", type=int, default=32, help="requests per case")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=2, help="Zipf cases (seeds 0..)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--loads", type=int, default=0, help="profile N first reads instead")
    args = ap.parse_args(argv)
    if args.loads:
        from bench.adapter_scale_loads import profile_loads

        profile_loads(MODEL, args.loads, args.reps, args.threads)
        return
    from loraserve.engine.engine import Engine
    from loraserve.engine.engine_config import EngineConfig
    from loraserve.engine.sampling.params import SamplingParams
    from loraserve.model.loader import load_model

    torch.set_num_threads(args.threads)
    plan = Plan(requests=args.requests)
    model = load_model(MODEL)
    eng = Engine(model, EngineConfig(n_slots=8, n_ctx=8192, cache_ram_mib=0))
    folder = lora_dir(args.adapters, "f16")
    cases: dict[str, list[int]] = {"none": [], "a0000 (r8)": [0] * plan.requests,
                                   "a0001 (r16)": [1] * plan.requests}  # fmt: skip
    for s in range(args.seeds):
        cases[f"Zipf seed {s}"] = zipf_choices(args.adapters, plan.requests, s)
    used = sorted({a for picks in cases.values() for a in picks})
    ids = {}
    for a in used:
        eng_a = eng.load_adapter(folder / f"a{a:04d}.gguf", 0.0, name=f"a{a:04d}")
        while not eng_a.done():
            eng.step()
        ids[a] = eng_a.result().id
    tok = model.tokenizer
    texts = prompts(plan, "p-")

    def run(picks: list[int], tag: str) -> tuple[float, int]:
        t0 = time.thread_time()
        subs = []
        for i, text in enumerate(texts):
            ids_ = tok.encode(f"{tag}{text}")
            lora = [(ids[picks[i]], 1.0)] if picks else None
            subs.append(eng.submit(prompts=[ids_], sampling=SamplingParams(temperature=0.0),
                                   max_tokens=plan.n_predict, lora=lora,
                                   cache_prompt=False))  # fmt: skip
        eng.run_until_idle()
        return time.thread_time() - t0, plan.n_predict * len(subs)

    run(cases["a0000 (r8)"], "warm")
    rng = random.Random(0)
    per: dict[str, list[float]] = {k: [] for k in cases}
    for rep in range(args.reps):
        order = list(cases)
        rng.shuffle(order)
        for name in order:
            secs, n = run(cases[name], f"r{rep}{name[:2]}")
            per[name].append(1e3 * secs / n)
    ref = per["a0000 (r8)"]
    print(f"thread-CPU ms a generated token, {args.threads} thread(s), {plan.requests} requests:")
    for name, ms in per.items():
        ratio = " ".join(f"{r / m:.3f}" for r, m in zip(ref, ms, strict=True))
        picks = cases[name]
        rank = sum(8 + 8 * (a % 2) for a in picks) / max(1, len(picks))
        cells = " ".join(f"{m:6.3f}" for m in ms)
        print(f"  {name:12s} {cells}   r8 over it: {ratio}   mean rank {rank:.1f}")


if __name__ == "__main__":
    main()
