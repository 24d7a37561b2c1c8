"""Speculative decoding, side by side: `python -m bench.spec [--reps N] [--n-predict N]`.

A copy-heavy workload (rewrite, extract and code-edit prompts whose answers repeat long
spans of the prompt), single stream, greedy, on:
- loraserve without speculation, then with it (`--ours-spec`, n-gram drafting);
- llama-server with each of its model-free `--spec-type`s at their defaults (`--peer-types`),
  with loraserve's own speculative flags (the same command line), and without;
the best llama-server configuration is the one compared. Also S2 (non-repetitive text, single
stream) on loraserve with speculation off and on. One server at a time; every answer of a
speculating server is compared with the same server's answers without speculation.

Prints the decode rates (client-side, tokens after the first per second), draft acceptance,
whether answers stayed identical, and the ratios the issue asks for:
copy-heavy loraserve on/off (>= 1.8x), loraserve on / llama-server best (>= 1.5x), and S2
on/off (>= 0.97x). Never run by the tests.
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.peer import find_peer
from bench.scenarios import Target, _run, s2_decode, warm_up
from bench.servers import ServerKind, free_port, launch, loraserve_kind, peer_kind, server_argv
from bench.workloads import Encode, sentence

OURS_SPEC = (
    "--spec-type ngram-simple,ngram-mod --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m"
    " 24 --spec-ngram-mod-n-match 8 --spec-ngram-mod-n-min 2 --spec-ngram-mod-n-max 24"
)
PEER_TYPES = "ngram-simple,ngram-mod,ngram-map-k,ngram-map-k4v,ngram-cache"
FUNCTION = '''def {name}(items, limit):
    """Return the {word} items under the limit, sorted."""
    result = []
    for item in items:
        if item.{field} < limit and item.active:
            result.append(item)
    result.sort(key=lambda item: item.{field})
    return result
'''


def copy_prompts(seed: int = 0) -> list[str]:
    """Rewrite, extract and code-edit prompts whose answers copy long spans of the prompt
    (for a base model: the prompt ends where the copy starts)."""
    rng = random.Random(seed)
    out = []
    for i in range(6):
        text = " ".join(sentence(rng, rng.randrange(10, 16)) for _ in range(6))
        kind = i % 3
        if kind == 0:
            example = sentence(rng, 8)
            out.append(f"Text: {example}\nThe same text: {example}\n\nText: {text}\nThe same text:")
        elif kind == 1:
            lines = [f"- {sentence(rng, rng.randrange(8, 14))}" for _ in range(12)]
            shot = "\n".join(lines[:2])
            log = "\n".join(lines[2:])
            out.append(f"Log:\n{shot}\nCopy:\n{shot}\n\nLog:\n{log}\nCopy:\n-")
        else:
            word = rng.choice(["cheap", "recent", "small"])
            fields = ("price", "age", "size")
            code = "\n".join(
                FUNCTION.format(name=f"select_{word}_{j}", word=word, field=fields[j % 3])
                for j in range(3)
            )
            out.append(
                f"```python\n{code}```\n\nThe same code with `limit` renamed to "
                "`threshold`:\n\n```python\ndef"
            )
    return out


def decode_run(target: Target, prompts: Sequence[list[int]], n_predict: int) -> dict[str, Any]:
    """Each prompt once, single stream: client decode rates, tokens, draft counters."""
    rates, answers, drafted, accepted = [], [], 0, 0
    for ids in prompts:
        payload = {
            "prompt": ids, "n_predict": n_predict, "temperature": 0.0,
            "cache_prompt": False, "return_tokens": True,
        }  # fmt: skip
        (c,), _ = _run(target, [payload], 120)
        rates.append(c.decode_rate or 0.0)
        answers.append(tuple(c.tokens))
        drafted += c.timings.get("draft_n", 0)
        accepted += c.timings.get("draft_n_accepted", 0)
    return {
        "tok_s": statistics.median(rates) if rates else 0.0,
        "answers": answers,
        "draft_n": drafted,
        "draft_n_accepted": accepted,
    }


def one_server(
    kind: ServerKind, model: Path, prompts: list[list[int]], args: argparse.Namespace,
    encode: Encode, bos: tuple[int, ...], s2: bool,
) -> dict[str, Any]:  # fmt: skip
    """Start one server, run the copy-heavy workload (best of ``--reps``), and S2."""
    port = free_port()
    argv = server_argv(kind, model, port, threads=args.threads, parallel=1, ctx=4096, cache_ram=0)
    with launch(kind.name, argv, port) as srv:
        t = Target(srv.url, 0, encode, bos, time.monotonic() + 900)
        warm_up(t)
        runs = [decode_run(t, prompts, args.n_predict) for _ in range(args.reps)]
        best = max(runs, key=lambda r: r["tok_s"])
        if s2:
            best["s2_tok_s"] = s2_decode(t, n_predict=args.n_predict, reps=args.reps)[
                "decode_tok_s"
            ]
    print(f"  {kind.name} {' '.join(kind.extra) or '(no speculation)'}: "
          f"{best['tok_s']:.1f} tok/s, drafts {best['draft_n_accepted']}/{best['draft_n']}",
          flush=True)  # fmt: skip
    return best


def main(argv: list[str] | None = None) -> None:
    """Run both servers' configurations one after another and print the table."""
    ap = argparse.ArgumentParser(prog="python -m bench.spec", description=__doc__)
    ap.add_argument("--model", type=Path, help="GGUF (default: loraserve's default model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=160)
    ap.add_argument("--reps", type=int, default=2, help="runs per configuration (best kept)")
    ap.add_argument("--ours-spec", default=OURS_SPEC, help="loraserve's speculative flags")
    ap.add_argument("--peer-types", default=PEER_TYPES, help="llama-server types to try")
    ap.add_argument("--peer-spec-args", default="", help="extra llama-server speculative flags")
    ap.add_argument("--no-peer", action="store_true", help="loraserve only")
    args = ap.parse_args(argv)
    from loraserve.model.default import default_model_path
    from loraserve.model.gguf import GGUFFile
    from loraserve.model.tokenizer import Tokenizer

    model = args.model or default_model_path()
    with GGUFFile(model) as g:
        tok = Tokenizer.from_gguf_metadata(g.metadata)
    prompts = [tok.encode(p, add_special=True, parse_special=True) for p in copy_prompts()]
    bos = (tok.bos_id,) if tok.bos_id is not None else ()

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special=False, parse_special=True)

    res: dict[str, dict[str, Any]] = {}
    print(f"copy-heavy workload: {len(prompts)} prompts, {args.n_predict} tokens, greedy")
    res["ours off"] = one_server(loraserve_kind(), model, prompts, args, encode, bos, True)
    ours_on = loraserve_kind(shlex.split(args.ours_spec))
    res["ours on"] = one_server(ours_on, model, prompts, args, encode, bos, True)
    binary = None if args.no_peer else find_peer()
    if binary is None and not args.no_peer:
        print("llama-server not found (python -m bench.run --build-peer): loraserve only")
    if binary is not None:
        res["peer off"] = one_server(peer_kind(binary), model, prompts, args, encode, bos, False)
        configs = {k: ["--spec-type", k] for k in args.peer_types.split(",")}
        configs["loraserve's flags"] = shlex.split(args.ours_spec)
        for name, flags in configs.items():
            extra = [*flags, *shlex.split(args.peer_spec_args)]
            try:
                peer = peer_kind(binary, extra)
                res[f"peer {name}"] = one_server(peer, model, prompts, args, encode, bos, False)
            except Exception as e:  # a type this build refuses: skip it
                print(f"  llama-server {' '.join(extra)}: failed ({e})", file=sys.stderr)
    report(res)


def report(res: dict[str, dict[str, Any]]) -> None:
    """The side-by-side table and the ratios."""
    print("\n| server | copy-heavy tok/s | drafts accepted | answers = spec off | S2 tok/s |")
    print("|---|---|---|---|---|")
    for name, r in res.items():
        base = res["peer off" if name.startswith("peer") else "ours off"]
        same = sum(a == b for a, b in zip(r["answers"], base["answers"], strict=True))
        acc = f"{r['draft_n_accepted']}/{r['draft_n']}" if r["draft_n"] else "-"
        s2 = f"{r['s2_tok_s']:.1f}" if r.get("s2_tok_s") else "-"
        print(f"| {name} | {r['tok_s']:.1f} | {acc} | {same}/{len(r['answers'])} | {s2} |")
    on, off = res["ours on"], res["ours off"]
    print(f"\nloraserve copy-heavy, speculation on/off: {on['tok_s'] / off['tok_s']:.2f}x (>= 1.8)")
    peers = {k: v for k, v in res.items() if k.startswith("peer ") and k != "peer off"}
    if peers:
        best = max(peers, key=lambda k: peers[k]["tok_s"])
        ratio = on["tok_s"] / peers[best]["tok_s"]
        print(f"loraserve on / llama-server best ({best[5:]}): {ratio:.2f}x (>= 1.5)")
    if on.get("s2_tok_s") and off.get("s2_tok_s"):
        print(f"S2 (non-repetitive), speculation on/off: {on['s2_tok_s'] / off['s2_tok_s']:.2f}x"
              " (>= 0.97)")  # fmt: skip


if __name__ == "__main__":
    main()
