"""The adapter catalogue and memory-tier flags (ours, with vLLM's `--lora-modules`):
`--lora-dir` directories whose adapters are served by name and read on first use (the load
endpoints read only from these), vLLM's named `--lora-modules`, and the bounds on resident
adapters, `--lora-max-loaded` and `--lora-max-memory` (`lora/tiers.py`)."""

from __future__ import annotations

import argparse

from loraserve.server.config.arg_types import float_in, int_in, lora_module


def add_flags(group: argparse._ArgumentGroup) -> None:
    """Register the catalogue and tier flags in ``group`` (their defaults come from
    `ServerConfig`)."""
    a = group.add_argument
    a(
        "--lora-dir",
        dest="lora_dirs",
        action="append",
        metavar="DIR",
        help="adapter catalogue: every GGUF LoRA file and PEFT folder in DIR is served by name "
        "(request `model` or a `lora` entry's `name`), read on first use; the load endpoints "
        "read only from these directories (repeatable)",
    )
    a(
        "--lora-modules",
        dest="lora_modules",
        action="extend",
        nargs="+",
        type=lora_module,
        metavar="NAME=PATH|JSON",
        help="vLLM's named adapters: name=path or "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\', read on first use',
    )
    a(
        "--lora-max-loaded",
        type=int_in(1),
        metavar="N",
        help="at most N adapters resident in memory; idle ones are evicted least recently "
        "used, never pinned ones or those in use (default: no limit)",
    )
    a(
        "--lora-max-memory",
        type=float_in(0.0),
        metavar="MiB",
        help="budget for resident adapter weights, evicted as --lora-max-loaded (default: none)",
    )
