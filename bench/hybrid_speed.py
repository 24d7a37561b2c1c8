"""Speed and prompt reuse of loraserve vs llama-server on real-shape random hybrid models
(issue 28's bench).

`python -m bench.hybrid_speed [--archs qwen35,granitehybrid,...] [--check] [--quick]` builds
the missing models (`bench.hybrid_synth`: Qwen3.5-4B, Granite-4.0-H-1B and the
`bench.hybrid_shapes` models (LFM2-1.2B, LFM2-8B-A1B, Nemotron-Nano-9B-v2,
Nemotron-3-Nano-30B-A3B, Falcon-H1-1.5B, mamba2-1.3b, Qwen3.5-35B-A3B, Qwen3-Next-80B-A3B)
layer shapes, fewer layers in the real ratio of layer kinds, random weights, Q4_K_M), then
for each model starts
llama-server and then loraserve, one at a time, with the same flags (`-t 2 -np 1 -c 4096
--cache-ram 8192`, llama-server's default cache budget and context checkpoints), and on each:

- S1 prefill tok/s: a 512-token prompt, cache off, median of the runs;
- S2 decode tok/s: one stream, `n_predict` tokens after a 128-token prompt, median;
- a multi-turn chat: a system prompt, then turns that each extend the conversation by the
  server's own answer and a new user message, then one branch (the last user message
  edited: the prompt leaves the cached one inside it, where a recurrent state must be
  restored from a snapshot/checkpoint). Run with `cache_prompt` false and then true; the
  prompt tokens each request recomputed are the server's `timings.prompt_n`;
- with `--check`: llama-server's greedy tokens after a fixed prompt and loraserve's
  teacher-forced top-1 on them (`bench.arch_speed.greedy`: positions that differ are listed
  with llama-server's top-1/top-2 gap there; random weights give near-ties).

Prompts are token ids (llama.cpp's `test` vocabulary). Writes
`bench/results/hybrid_speed_<ts>.json` and prints the table. `--quick` proves the pipeline
on small files (each layer kind once, a 4096 vocabulary, short runs): its figures are not the
bench's. `--archs` defaults to qwen35,granitehybrid; `all` names every arch. `--scan-form
chunked` runs loraserve's delta-net and Mamba-2 scans in their chunked form.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.arch_speed import CHECK_PROMPT, _top2, compare, encoder
from bench.hybrid_synth import DEFAULT_LAYERS, REAL, synth_model
from bench.scenarios import Target, s1_prefill, s2_decode, warm_up
from bench.servers import (
    CpuMeter,
    ServerKind,
    free_port,
    launch,
    loraserve_kind,
    machine,
    machine_load,
    peer_kind,
    server_argv,
)

RESULTS = Path(__file__).parent / "results"
TARGETS = {"prefill": 1.5, "decode": 1.0}
# the fewest layers that hold every layer kind once (`bench.hybrid_shapes` patterns)
QUICK_LAYERS = {"qwen35": 4, "granitehybrid": 10, "lfm2": 3, "nemotron_h": 6, "falcon-h1": 1,
                "mamba2": 2, "qwen35moe": 4, "lfm2moe": 3, "qwen3next": 4,
                "nemotron_h_moe": 6}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """Sizes of the run; `layers` 0 means each arch's default (`hybrid_synth.DEFAULT_LAYERS`)."""

    archs: tuple[str, ...] = tuple(REAL)
    layers: int = 0
    vocab: int | None = None
    threads: int = 2
    n_prompt: int = 512
    prefill_reps: int = 2
    decode_prompt: int = 128
    n_predict: int = 64
    decode_reps: int = 2
    # chat sizes off the 16-token block grid, as a real conversation's are
    system: int = 250  # chat: the system prompt's tokens
    user: int = 37  # chat: each user message's tokens
    answer: int = 40  # chat: each answer's tokens
    turns: int = 5
    check_tokens: int = 0
    cap: float = 600.0
    launch_timeout: float = 600.0
    quick: bool = False


def quick_plan(archs: tuple[str, ...]) -> Plan:
    """The pipeline check: small files, short runs."""
    return Plan(archs, 0, 4096, n_prompt=128, prefill_reps=1, decode_prompt=32, n_predict=16,
                decode_reps=1, system=60, user=13, answer=12, turns=3, cap=300.0,
                quick=True)  # fmt: skip


def _complete(url: str, prompt: list[int], n: int, cache: bool) -> tuple[list[int], int | None]:
    """Greedy `n` tokens after `prompt`: the tokens and the prompt tokens the server computed."""
    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "ignore_eos": True,
            "return_tokens": True, "cache_prompt": cache}  # fmt: skip
    r = httpx.post(f"{url}/completion", json=body, timeout=600)
    r.raise_for_status()
    data = r.json()
    return list(data.get("tokens") or []), (data.get("timings") or {}).get("prompt_n")


def chat(url: str, plan: Plan, vocab: int, cache: bool, seed: int = 28) -> dict[str, Any]:
    """The multi-turn chat (see the module doc): per request its prompt length and the prompt
    tokens the server recomputed, and their totals."""
    rng = random.Random(seed)

    def words(n: int) -> list[int]:
        return [rng.randrange(4, vocab) for _ in range(n)]

    history, turns = words(plan.system), []
    before_last: list[int] = []
    for _ in range(plan.turns):
        before_last = list(history)
        prompt = history + words(plan.user)
        answer, computed = _complete(url, prompt, plan.answer, cache)
        turns.append({"prompt": len(prompt), "prompt_n": computed})
        history = prompt + answer
    prompt = before_last + words(plan.user)  # the last user message edited
    _, computed = _complete(url, prompt, plan.answer, cache)
    turns.append({"prompt": len(prompt), "prompt_n": computed, "branch": True})
    return {"turns": turns, "prompt_tokens": sum(t["prompt"] for t in turns),
            "recomputed": sum(t["prompt_n"] or 0 for t in turns)}  # fmt: skip


def greedy(url: str, n: int, vocab: int, ref: list[int] | None = None) -> dict[str, Any]:
    """`bench.arch_speed.greedy` on its check prompt taken modulo `vocab`: `n` free-running
    greedy tokens, or with `ref` the top-1 teacher-forced on the reference's tokens."""
    prompt = [t % vocab for t in CHECK_PROMPT]
    if ref is None:
        tokens, gaps = _top2(url, prompt, n)
        return {"tokens": tokens, "gaps": gaps}
    out: dict[str, Any] = {"tokens": [], "gaps": []}
    for i in range(len(ref)):
        tokens, gaps = _top2(url, [*prompt, *ref[:i]], 1)
        out["tokens"] += tokens
        out["gaps"] += gaps
    return out


def one_server(
    kind: ServerKind, model: Path, plan: Plan, vocab: int, ref: list[int] | None = None
) -> dict[str, Any]:
    """Start `kind` on `model`, run the check, S1, S2 and the chat both ways, stop it."""
    port = free_port()
    argv = server_argv(kind, model, port, threads=plan.threads, parallel=1, ctx=4096,
                       cache_ram=8192)  # fmt: skip
    out: dict[str, Any] = {"load1_before": machine_load()["load1"]}
    try:
        with launch(kind.name, argv, port, plan.launch_timeout) as srv:
            out["startup_s"] = srv.startup_s
            if plan.check_tokens:
                out["check"] = greedy(srv.url, plan.check_tokens, vocab, ref)
            t = Target(srv.url, 0, encoder(vocab), (), time.monotonic() + plan.cap)
            warm_up(t)
            meter = CpuMeter(srv.proc.pid)
            pre = s1_prefill(t, plan.n_prompt, plan.prefill_reps, cap=plan.cap / 3)
            dec = s2_decode(t, plan.decode_prompt, plan.n_predict, plan.decode_reps,
                            cap=plan.cap / 3)  # fmt: skip
            out["other_cores"] = meter.other_cores()
            out.update(prefill_tok_s=pre["prefill_tok_s"], decode_tok_s=dec["decode_tok_s"],
                       prefill=pre, decode=dec, peak_rss_mib=srv.peak_rss_mib())  # fmt: skip
            # other conversations each way: neither run finds the other's prompts cached
            out["chat_no_cache"] = chat(srv.url, plan, vocab, cache=False, seed=28)
            out["chat_cache"] = chat(srv.url, plan, vocab, cache=True, seed=29)
    except Exception as e:  # recorded; the other server and models still run
        out["error"] = f"{type(e).__name__}: {e}"
    out["load1_after"] = machine_load()["load1"]
    return out


def run(plan: Plan, kinds: list[ServerKind]) -> dict[str, Any]:
    """Every model of `plan` on every server, servers one after the other."""
    res: dict[str, Any] = {
        "meta": {"timestamp": time.strftime("%Y-%m-%d %H:%M:%S"), "plan": asdict(plan),
                 "machine": machine(), "load_before": machine_load(), "targets": TARGETS},
        "models": {},
    }  # fmt: skip
    t0 = time.monotonic()
    for arch in plan.archs:
        layers = plan.layers or (QUICK_LAYERS if plan.quick else DEFAULT_LAYERS)[arch]
        vocab = plan.vocab or REAL[arch][3]
        path = synth_model(arch, layers, vocab)
        entry: dict[str, Any] = {"shape": REAL[arch][0], "layers": layers, "vocab": vocab,
                                 "file": path.name,
                                 "file_mib": path.stat().st_size / 2**20}  # fmt: skip
        ref = None
        for kind in kinds:  # llama-server first: its greedy tokens are the check's reference
            print(f"hybrid_speed: {arch} ({layers} layers) on {kind.name}", file=sys.stderr)
            entry[kind.name] = one_server(kind, path, plan, vocab, ref)
            ref = ref or (entry[kind.name].get("check") or {}).get("tokens")
        if len(kinds) == 2:
            entry["compare"] = compare(entry[kinds[0].name], entry[kinds[1].name])
        res["models"][arch] = entry
    res["meta"]["load_after"] = machine_load()
    res["meta"]["wall_s"] = time.monotonic() - t0
    return res


def _f(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(res: dict[str, Any]) -> str:
    """A Markdown table of one run."""
    rows = ["| model | server | prefill tok/s | decode tok/s | chat prompt tokens | "
            "recomputed, cache off | recomputed, cache on | start s |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    notes = []
    for arch, e in res["models"].items():
        for name in ("llama-server", "loraserve"):
            s = e.get(name, {})
            off, on = s.get("chat_no_cache") or {}, s.get("chat_cache") or {}
            rows.append(f"| {arch} ({e['shape']}, {e['layers']} layers) | {name} | "
                        f"{_f(s.get('prefill_tok_s'))} | {_f(s.get('decode_tok_s'), '.2f')} | "
                        f"{on.get('prompt_tokens', '-')} | {off.get('recomputed', '-')} | "
                        f"{on.get('recomputed', '-')} | {_f(s.get('startup_s'))} |")  # fmt: skip
            if on:
                per = ", ".join(str(t["prompt_n"]) for t in on["turns"])
                notes.append(f"{arch} {name} cache on, prompt_n per request: {per}")
            if "error" in s:
                notes.append(f"{arch} {name}: {s['error'][:300]}")
        c = e.get("compare", {})
        rows.append(f"| {arch} | ratio | {_f(c.get('prefill_ratio'), '.2f')}x | "
                    f"{_f(c.get('decode_ratio'), '.2f')}x (target 1.0x) | | | | |")  # fmt: skip
        if chk := c.get("check"):
            notes.append(
                f"{arch} check: teacher-forced greedy equal on {chk['equal']}/"
                f"{chk['of']} (differ at, peer gap: {chk['differ_at_peer_gap']})"
            )
    return "\n".join(rows + [""] + notes)


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.hybrid_speed [--archs A,B] [--layers N] [--check] [--quick]`."""
    from bench.peer import find_peer

    ap = argparse.ArgumentParser(prog="python -m bench.hybrid_speed", description=__doc__)
    ap.add_argument("--archs", default="qwen35,granitehybrid", help="comma list, or all")
    ap.add_argument("--layers", type=int, default=0, help="default: per arch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="compare greedy tokens too")
    ap.add_argument("--quick", action="store_true", help="pipeline check, not a measurement")
    ap.add_argument("--turns", type=int, default=0, help="chat turns (default 5)")
    ap.add_argument("--n-predict", type=int, default=0, help="decode tokens (default 64)")
    ap.add_argument(
        "--scan-form",
        choices=("recurrent", "chunked"),
        default="recurrent",
        help="loraserve's --scan-form (delta-net and Mamba-2 scans)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    names = ",".join(REAL) if args.archs == "all" else args.archs
    archs = tuple(a.strip() for a in names.split(",") if a.strip())
    if unknown := set(archs) - set(REAL):
        ap.error(f"unknown arch(s) {sorted(unknown)}; known: {', '.join(REAL)}")
    plan = quick_plan(archs) if args.quick else Plan(archs)
    plan = Plan(**{**asdict(plan), "archs": archs, "threads": args.threads,
                   "layers": args.layers, "check_tokens": 8 if args.check else 0,
                   "turns": args.turns or plan.turns,
                   "n_predict": args.n_predict or plan.n_predict})  # fmt: skip
    peer = find_peer()
    if peer is None:
        sys.exit("hybrid_speed: no llama-server (python -m bench.peer --build)")
    res = run(plan, [peer_kind(peer), loraserve_kind(["--scan-form", args.scan_form])])
    res["meta"].update(quick=args.quick, scan_form=args.scan_form)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"hybrid_speed_{time.strftime('%Y-%m-%d_%H%M%S')}.json"
    path.write_text(json.dumps(res, indent=1))
    print(table(res))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
