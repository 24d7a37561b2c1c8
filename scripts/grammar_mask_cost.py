"""Measure the per-token cost of grammar masks on the real vocabulary (Gemma 3 270M's
262,144 tokens): `python scripts/grammar_mask_cost.py [--model PATH] [--tokens N]`.

For a few grammars (GBNF, JSON schemas), it walks N tokens of a valid answer (greedy over
the allowed tokens, with random logits) and prints the median and p90 time of computing
the mask (llguidance), applying it to a logits row, and consuming the token (llguidance).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from loraserve.engine.constraint import Constraint, Grammars, GrammarSpec
from loraserve.model.default import resolve_model_path
from loraserve.model.gguf import GGUFFile
from loraserve.model.tokenizer import Tokenizer

CASES = {
    "gbnf a{5}": GrammarSpec("gbnf", 'root ::= "a"{5,5}'),
    "gbnf list": GrammarSpec("gbnf", 'root ::= "[" item ("," item)* "]"\nitem ::= [a-z]+'),
    "json any object": GrammarSpec("json_schema", json.dumps({"type": "object"})),
    "json person": GrammarSpec(
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 40},
                    "age": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                },
                "required": ["name", "age", "tags"],
            }
        ),
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = resolve_model_path(args.model)
    tok = Tokenizer.from_gguf_metadata(GGUFFile(path).metadata)
    grammars = Grammars(tok)
    t0 = time.perf_counter()
    grammars.lltok  # noqa: B018 - build it once
    print(
        f"vocabulary {tok.vocab_size} tokens; llguidance tokenizer built in "
        f"{time.perf_counter() - t0:.2f} s"
    )
    gen = torch.Generator().manual_seed(0)
    for name, spec in CASES.items():
        t0 = time.perf_counter()
        c = Constraint(grammars, grammars.compile(spec))
        build = time.perf_counter() - t0
        mask_us, apply_us, consume_us, n = [], [], [], 0
        for _ in range(args.tokens):
            if c.finished:
                break
            row = torch.randn(tok.vocab_size, generator=gen)
            t1 = time.perf_counter()
            bits = c.compute()  # llguidance alone
            t2 = time.perf_counter()
            c.apply(row, bits)
            t3 = time.perf_counter()
            token = int(row.argmax())
            t4 = time.perf_counter()
            c.accept(token)
            t5 = time.perf_counter()
            mask_us.append((t2 - t1) * 1e6)
            apply_us.append((t3 - t2) * 1e6)
            consume_us.append((t5 - t4) * 1e6)
            n += 1
        q = statistics.quantiles(mask_us, n=10) if len(mask_us) > 1 else mask_us * 9
        print(
            f"{name:16s} compile {build * 1e3:5.1f} ms; {n:3d} tokens: mask median "
            f"{statistics.median(mask_us):5.0f} us (p90 {q[-1]:5.0f}), apply "
            f"{statistics.median(apply_us):4.0f} us, "
            f"consume {statistics.median(consume_us):4.0f} us"
        )


if __name__ == "__main__":
    main()
