"""Speed of loraserve vs llama-server on real-shape random models (issue 27 item 5).

`python -m bench.arch_speed [--archs qwen3moe,gpt-oss,deepseek2,llama,...] [--layers N]
[--check] [--quick]` builds the missing models (`bench.synth_archs`: Qwen3-30B-A3B,
gpt-oss-20b and DeepSeek-V2-Lite layer shapes, and the dense families of
`bench.arch_shapes`: Llama 3.1 8B, Qwen2.5 7B, Qwen3 8B, Phi 3.5 mini, Gemma 2 9B, ...;
random weights, Q4_K_M; 4 layers unless `LAYERS` says otherwise), then for each model starts
llama-server and then loraserve, one at a time, with the same flags (`-t 2 -np 1 -c 2048
--cache-ram 0`), and measures on each:

- S1 prefill tok/s: a 512-token prompt, `n_predict` 1, cache off, median of 3;
- S2 decode tok/s: one stream, 256 tokens after a 128-token prompt, median of 5 (with 2 x 128
  tokens, deepseek2's ratio went 0.93-1.26x over four runs: too short to settle 1.0x);
- peak RSS: the server's VmHWM after the requests;
- with `--check`: llama-server's greedy tokens after a fixed prompt, and loraserve's top-1
  teacher-forced on that prefix at each position; positions that differ are listed with
  llama-server's top-1/top-2 log-probability gap there (random weights give near-flat
  logits: a split at a gap of a few hundredths is a near-tie, not a bug).

Prompts are token ids (the models have llama.cpp's `test` vocabulary). It prints the
loraserve / llama-server ratios against the targets (prefill >= 1.5x, decode >= 1.0x) and
writes `bench/results/arch_speed_<ts>.json`. `--quick` proves the pipeline on smaller
files (1 layer, 2 for deepseek2's dense + MoE pair, a 32768 vocabulary) with one prefill and
one 64-token decode: its figures are not the bench's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.scenarios import Target, s1_prefill, s2_decode, warm_up
from bench.servers import (
    CLK_TCK,
    CpuMeter,
    ServerKind,
    _proc_jiffies,
    free_port,
    launch,
    loraserve_kind,
    machine,
    machine_load,
    peer_kind,
    server_argv,
)
from bench.synth_archs import SHAPES, shape_of, synth_model

TARGETS = {"prefill": 1.5, "decode": 1.0}
QUICK_LAYERS = {"deepseek2": 2}  # 1 for the others
LAYERS: dict[str, int] = {}  # layers where `--layers` is not given, by arch; else 4
QUICK_VOCAB = 32768
CHECK_PROMPT = (5, 17, 99, 1000, 7, 3, 4242, 12)
RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Plan:
    """Sizes of the run; `layers` None means each arch's quick layer count, 0 its `LAYERS`."""

    archs: tuple[str, ...] = tuple(SHAPES)
    layers: int | None = 0
    vocab: int | None = None
    threads: int = 2
    n_prompt: int = 512
    prefill_reps: int = 3
    decode_prompt: int = 128
    n_predict: int = 256
    decode_reps: int = 5
    check_tokens: int = 8
    cap: float = 600.0
    launch_timeout: float = 900.0


def quick_plan(archs: tuple[str, ...]) -> Plan:
    """The pipeline check: small files, one prefill, one 64-token decode."""
    return Plan(archs, None, QUICK_VOCAB, prefill_reps=1, n_predict=64, decode_reps=1,
                cap=300.0)  # fmt: skip


def encoder(vocab: int) -> Any:
    """Text -> ids in [0, vocab), one per word (crc32): the same prompts for both servers."""
    return lambda text: [zlib.crc32(w.encode()) % vocab for w in text.split()]


def _top2(url: str, prompt: list[int], n: int) -> tuple[list[int], list[float | None]]:
    """`n` greedy tokens after `prompt` and each one's top-1/top-2 log-probability gap."""
    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "n_probs": 2,
            "ignore_eos": True, "return_tokens": True, "cache_prompt": False}  # fmt: skip
    r = httpx.post(f"{url}/completion", json=body, timeout=600)
    r.raise_for_status()
    tokens, gaps = [], []
    for pos in r.json().get("completion_probabilities", []):
        top = pos.get("top_logprobs", [])
        tokens.append(top[0]["id"] if top else None)
        gaps.append(top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else None)
    return tokens, gaps


def greedy(url: str, n: int, ref: list[int] | None = None) -> dict[str, Any]:
    """`n` greedy tokens after CHECK_PROMPT (free-running), or with `ref` the top-1 after
    CHECK_PROMPT + ref[:i] for each i (teacher-forced on the reference's tokens)."""
    if ref is None:
        tokens, gaps = _top2(url, list(CHECK_PROMPT), n)
        return {"tokens": tokens, "gaps": gaps}
    out: dict[str, Any] = {"tokens": [], "gaps": []}
    for i in range(len(ref)):
        tokens, gaps = _top2(url, [*CHECK_PROMPT, *ref[:i]], 1)
        out["tokens"] += tokens
        out["gaps"] += gaps
    return out


def one_server(
    kind: ServerKind, model: Path, plan: Plan, vocab: int, ref: list[int] | None = None
) -> dict[str, Any]:
    """Start `kind` on `model`, measure S1, S2 (and the check tokens, teacher-forced on
    `ref` if given), stop it."""
    port = free_port()
    argv = server_argv(kind, model, port, threads=plan.threads, parallel=1, ctx=2048,
                       cache_ram=0)  # fmt: skip
    out: dict[str, Any] = {"load1_before": machine_load()["load1"]}
    try:
        with launch(kind.name, argv, port, plan.launch_timeout) as srv:
            out["startup_s"] = srv.startup_s
            if plan.check_tokens:
                out["check"] = greedy(srv.url, plan.check_tokens, ref)
            t = Target(srv.url, 0, encoder(vocab), (), time.monotonic() + plan.cap)
            warm_up(t)
            meter = CpuMeter(srv.proc.pid)
            j0 = _proc_jiffies(srv.proc.pid)
            pre = s1_prefill(t, plan.n_prompt, plan.prefill_reps, cap=plan.cap / 2)
            j1 = _proc_jiffies(srv.proc.pid)
            dec = s2_decode(t, plan.decode_prompt, plan.n_predict, plan.decode_reps,
                            cap=plan.cap / 2)  # fmt: skip
            out["other_cores"] = meter.other_cores()
            out["cpu_ms"] = _cpu_per_token(j1 - j0, _proc_jiffies(srv.proc.pid) - j1, pre, dec,
                                           plan.decode_prompt)  # fmt: skip
            out.update(prefill_tok_s=pre["prefill_tok_s"], decode_tok_s=dec["decode_tok_s"],
                       prefill=pre, decode=dec, peak_rss_mib=srv.peak_rss_mib())  # fmt: skip
    except Exception as e:  # recorded; the other server and models still run
        out["error"] = f"{type(e).__name__}: {e}"
    out["load1_after"] = machine_load()["load1"]
    return out


def _cpu_per_token(
    pre_j: int, dec_j: int, pre: dict[str, Any], dec: dict[str, Any], dec_prompt: int
) -> dict[str, float | None]:
    """The server's CPU ms (all its threads) per prompt token in S1 and per generated token
    in S2 (S2's prompts charged at S1's rate). At `--threads 1` this is the work per token,
    which time-slicing by other processes does not inflate as it does wall time."""
    n_pre = sum(r.get("prompt_n") or 0 for r in pre.get("runs", []))
    runs = dec.get("runs", [])
    n_dec = sum(r.get("n_tokens") or 0 for r in runs)
    per_pre = pre_j * 1e3 / CLK_TCK / n_pre if n_pre else None
    if not n_dec or per_pre is None:
        return {"prefill": per_pre, "decode": None}
    return {
        "prefill": per_pre,
        "decode": (dec_j * 1e3 / CLK_TCK - per_pre * dec_prompt * len(runs)) / n_dec,
    }


def compare(peer: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """The ratios loraserve / llama-server and the check tokens' agreement."""
    out: dict[str, Any] = {}
    for key in ("prefill", "decode"):
        a, b = ours.get(f"{key}_tok_s"), peer.get(f"{key}_tok_s")
        out[f"{key}_ratio"] = a / b if a and b else None
        ca, cb = (s.get("cpu_ms", {}).get(key) for s in (ours, peer))
        out[f"{key}_cpu_ratio"] = cb / ca if ca and cb else None  # llama-server's / ours
        out[f"{key}_meets_target"] = bool(a and b and a / b >= TARGETS[key])
    p, o = peer.get("check"), ours.get("check")
    if p and o:
        pairs = list(zip(p["tokens"], o["tokens"], p["gaps"], strict=False))
        diff = [(i, g) for i, (a, b, g) in enumerate(pairs) if a != b]
        out["check"] = {"equal": len(pairs) - len(diff), "of": len(pairs),
                        "differ_at_peer_gap": diff}  # fmt: skip
    return out


def _head() -> str | None:
    """The repository's HEAD commit (the code the figures are of), if git answers."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run(plan: Plan, kinds: list[ServerKind]) -> dict[str, Any]:
    """Every model of `plan` on every server, servers one after the other."""
    res: dict[str, Any] = {
        "meta": {"timestamp": time.strftime("%Y-%m-%d %H:%M:%S"), "plan": asdict(plan),
                 "machine": machine(), "load_before": machine_load(), "targets": TARGETS,
                 "head": _head()},
        "models": {},
    }  # fmt: skip
    t0 = time.monotonic()
    for arch in plan.archs:
        if plan.layers is None:
            layers = QUICK_LAYERS.get(arch, 1)
        else:
            layers = plan.layers or LAYERS.get(arch, 4)
        shape = shape_of(arch, layers, plan.vocab)
        path = synth_model(arch, layers, plan.vocab)
        entry: dict[str, Any] = {"shape": shape.label, "layers": layers, "vocab": shape.vocab,
                                 "file": path.name,
                                 "file_mib": path.stat().st_size / 2**20}  # fmt: skip
        ref = None
        for kind in kinds:  # llama-server first: its greedy tokens are the check's reference
            print(f"arch_speed: {arch} ({layers} layers) on {kind.name}", file=sys.stderr)
            entry[kind.name] = one_server(kind, path, plan, shape.vocab, ref)
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
    rows = ["| model | layers | server | prefill tok/s | decode tok/s | peak RSS MiB | start s |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    notes = []
    for arch, e in res["models"].items():
        for name in ("llama-server", "loraserve"):
            s = e.get(name, {})
            rows.append(f"| {arch} ({e['shape']}) | {e['layers']} | {name} | "
                        f"{_f(s.get('prefill_tok_s'))} | {_f(s.get('decode_tok_s'), '.2f')} | "
                        f"{_f(s.get('peak_rss_mib'), '.0f')} | "
                        f"{_f(s.get('startup_s'))} |")  # fmt: skip
            if "error" in s:
                notes.append(f"{arch} {name}: {s['error'][:300]}")
        c = e.get("compare", {})
        chk = c.get("check")
        rows.append(f"| {arch} | | ratio | {_f(c.get('prefill_ratio'), '.2f')}x "
                    f"(target {TARGETS['prefill']}x) | {_f(c.get('decode_ratio'), '.2f')}x "
                    f"(target {TARGETS['decode']}x) | | |")  # fmt: skip
        if c.get("decode_cpu_ratio") or c.get("prefill_cpu_ratio"):
            notes.append(f"{arch} CPU per token, llama-server's / ours: prefill "
                         f"{_f(c.get('prefill_cpu_ratio'), '.2f')}x, decode "
                         f"{_f(c.get('decode_cpu_ratio'), '.2f')}x")  # fmt: skip
        if chk:
            where = ", ".join(f"{i} (gap {_f(g, '.3f')})" for i, g in chk["differ_at_peer_gap"])
            tail = f"; differ at {where}" if where else ""
            notes.append(f"{arch} check: teacher-forced greedy equal on {chk['equal']}/"
                         f"{chk['of']} positions{tail}")  # fmt: skip
    return "\n".join(rows + [""] + notes)


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.arch_speed [--archs A,B] [--layers N] [--check] [--quick]`."""
    from bench.peer import find_peer

    ap = argparse.ArgumentParser(prog="python -m bench.arch_speed", description=__doc__)
    ap.add_argument("--archs", default=",".join(SHAPES))
    ap.add_argument("--layers", type=int, default=0, help="default: LAYERS[arch] or 4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="compare greedy tokens too")
    ap.add_argument("--quick", action="store_true", help="pipeline check, not a measurement")
    ap.add_argument("--decode-reps", type=int, default=None, help="S2 requests (default 5)")
    ap.add_argument("--n-predict", type=int, default=None, help="S2 tokens each (default 256)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    archs = tuple(a.strip() for a in args.archs.split(",") if a.strip())
    if unknown := set(archs) - set(SHAPES):
        ap.error(f"unknown arch(s) {sorted(unknown)}; known: {', '.join(SHAPES)}")
    plan = quick_plan(archs) if args.quick else Plan(archs, args.layers)
    plan = Plan(**{**asdict(plan), "archs": archs, "threads": args.threads,
                   "check_tokens": 8 if args.check else 0})  # fmt: skip
    if args.decode_reps or args.n_predict:
        plan = Plan(**{**asdict(plan), "decode_reps": args.decode_reps or plan.decode_reps,
                       "n_predict": args.n_predict or plan.n_predict})  # fmt: skip
    peer = find_peer()
    if peer is None:
        sys.exit("arch_speed: no llama-server (python -m bench.peer --build)")
    res = run(plan, [peer_kind(peer), loraserve_kind()])
    res["meta"]["quick"] = args.quick
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"arch_speed_{time.strftime('%Y-%m-%d_%H%M%S')}.json"
    path.write_text(json.dumps(res, indent=1))
    print(table(res))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
