#!/usr/bin/env python3
"""Train the two demo LoRA adapters for Gemma 3 270M and export them for llama.cpp.

Everything is generated here, nothing is downloaded:

1. A few hundred plain-text prompts are composed from templates and word lists
   (:func:`build_train_prompts`); the base model's own greedy continuation of each is the
   content the adapters learn to restyle.
2. Each continuation is transformed into a target style (``loraserve.adapters``):
   ``uppercase`` (the continuation in UPPERCASE) and ``titlecase`` (Every Word Capitalized).
3. One PEFT LoRA per style (rank 8, alpha 16, all attention and MLP projections) is trained
   in float32 on the CPU with the loss on the continuation tokens only, and saved as float16
   safetensors in ``loraserve/adapters/<style>/``.
4. Each PEFT folder is converted to llama.cpp's GGUF LoRA format
   (``loraserve/adapters/<style>.gguf``) the way llama.cpp's ``convert_lora_to_gguf.py``
   writes it (same metadata keys, F16 tensors ``blk.N.<name>.weight.lora_a`` [rank, in] and
   ``.lora_b`` [out, rank]).
5. The saved adapters are checked with transformers + PEFT on held-out prompts (greedy,
   40 tokens, with and without each adapter) and, when ``--llama-server`` is given, with
   llama.cpp's ``llama-server`` on the GGUF files.

Usage (from the repository root; ~45 min on two heavily shared cores, far less on idle ones)::

    python scripts/train_demo_adapters.py                  # generate, train, export, check
    python scripts/train_demo_adapters.py --check-only     # re-check the committed adapters
    python scripts/train_demo_adapters.py --export-only    # rebuild the .gguf files
    python scripts/train_demo_adapters.py --check-only \\
        --llama-server /path/to/llama-server               # also check llama.cpp
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from demo_check import check_hf, check_llama_cpp  # noqa: E402
from demo_export import export_gguf  # noqa: E402
from demo_model import (  # noqa: E402
    build_examples,
    generate,
    load_base,
    resolve_model,
    seed_everything,
    train_adapter,
)
from demo_prompts import DEFAULT_MODEL, GEN_NEW_TOKENS, HELD_OUT_PROMPTS, SEED, build_train_prompts  # noqa: E402

from loraserve.adapters import (  # noqa: E402
    ADAPTERS_DIR,
    DEMO_ADAPTERS,
    STYLE_TRANSFORM,
)

# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="base GGUF model")
    ap.add_argument("--styles", default=",".join(DEMO_ADAPTERS), help="comma-separated styles")
    ap.add_argument("--n-prompts", type=int, default=320, help="training prompts")
    ap.add_argument("--steps", type=int, default=48, help="optimizer steps per adapter")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--data-cache", type=Path, default=None, help="JSON file caching the base continuations"
    )
    ap.add_argument("--check-only", action="store_true", help="check the saved adapters only")
    ap.add_argument("--export-only", action="store_true", help="only rewrite the .gguf files")
    ap.add_argument("--no-check", action="store_true", help="skip the transformers check")
    ap.add_argument("--llama-server", type=Path, default=None, help="also check with llama.cpp")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    styles = [s for s in args.styles.split(",") if s]
    for style in styles:
        if style not in STYLE_TRANSFORM:
            ap.error(f"unknown style {style!r}; known: {sorted(STYLE_TRANSFORM)}")
    model_path = resolve_model(args.model)

    if args.export_only:
        for style in styles:
            export_gguf(ADAPTERS_DIR / style, ADAPTERS_DIR / f"{style}.gguf", style.capitalize())
        return 0

    base = tok = None
    if not args.check_only:
        seed_everything(args.seed)
        base, tok = load_base(model_path)
        prompts = build_train_prompts(args.n_prompts, args.seed)
        cache = args.data_cache
        if cache is not None and cache.is_file():
            data = json.loads(cache.read_text())
            assert data["prompts"] == prompts, "stale --data-cache"
            continuations = data["continuations"]
        else:
            t0 = time.time()
            continuations = generate(base, tok, prompts, GEN_NEW_TOKENS, batch_size=32)
            print(f"generated {len(prompts)} base continuations in {time.time() - t0:.0f}s")
            if cache is not None:
                cache.write_text(json.dumps({"prompts": prompts, "continuations": continuations}))
        keep = [i for i, c in enumerate(continuations) if sum(ch.isalpha() for ch in c) >= 20]
        print(f"{len(keep)}/{len(prompts)} continuations have enough letters to train on")
        for style in styles:
            targets = [STYLE_TRANSFORM[style](continuations[i]) for i in keep]
            examples = build_examples(tok, [prompts[i] for i in keep], targets)
            print(f"\n== training {style!r}: e.g. {prompts[keep[0]]!r} -> {targets[0]!r}")
            secs = train_adapter(
                base,
                examples,
                ADAPTERS_DIR / style,
                steps=args.steps,
                batch_size=args.batch_size,
                lr=args.lr,
                seed=args.seed,
            )
            print(f"trained {style!r} in {secs:.0f}s")
            export_gguf(ADAPTERS_DIR / style, ADAPTERS_DIR / f"{style}.gguf", style.capitalize())

    if not args.no_check:
        if base is None:
            base, tok = load_base(model_path)
        check_hf(base, tok, styles, HELD_OUT_PROMPTS)
    if args.llama_server is not None:
        del base
        check_llama_cpp(args.llama_server, model_path, styles, HELD_OUT_PROMPTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
