"""The llama-server flags loraserve does not implement: those it accepts and ignores, and
those it refuses with a reason.

These lists follow llama-server's releases; `args.py` follows loraserve's configuration.
"""

from __future__ import annotations

import argparse
from typing import Any

# Accepted and ignored, as words; "|" joins the spellings of one flag.
IGNORED_SWITCHES = """
    --no-jinja --mlock --mmap --no-mmap
    --log-disable --log-timestamps --log-prefix
    -cb|--cont-batching -nocb|--no-cont-batching
    --warmup --no-warmup --swa-full --context-shift --no-context-shift --cache-idle-slots
    --no-cache-idle-slots --props --no-perf --check-tensors --reuse-port
    --op-offload --no-op-offload --backend_sampling|--backend-sampling
""".split()
IGNORED_OPTIONAL_VALUE = "-fa|--flash-attn -fit|--fit --log-colors".split()
IGNORED_WITH_VALUE = """
    -ngl|--gpu-layers|--n-gpu-layers
    -tb|--threads-batch --threads-http -to|--timeout -sps|--slot-prompt-similarity
    --cache-reuse --keep
    -sm|--split-mode -ts|--tensor-split -mg|--main-gpu -dev|--device -ot|--override-tensor
    -ncmoe|--n-cpu-moe -fitt|--fit-target -fitc|--fit-ctx --numa --prio --poll
    -dt|--defrag-thold -lv|--verbosity|--log-verbosity --log-file --media-path
    --sse-ping-interval --path
""".split()

# Flags llama-server has and loraserve refuses, with why (an error beats a silent difference).
UNSUPPORTED_FLAGS = {
    "-mu|--model-url": "downloading models; pass -m PATH (or -hf REPO[:TAG] of the cache)",
    "-mm|--mmproj|-mmu|--mmproj-url": "multimodal models",
    "--grammar|--grammar-file|-j|--json-schema|-jf|--json-schema-file": (
        "a server-wide grammar; send `grammar` or `json_schema` with each request"
    ),
    "--api-prefix": "an API prefix",
}


class _Refused(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        parser.error(f"argument {option_string}: not supported by loraserve ({self.const})")


class _Ignored(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        namespace.ignored = [*namespace.ignored, option_string]


def add_llama_flags(p: argparse.ArgumentParser) -> None:
    """Register the ignored flags (listed in `--help`) and the refused ones (hidden)."""
    i = p.add_argument_group("accepted for compatibility with llama-server and ignored")
    for words, kwargs in (
        (IGNORED_SWITCHES, {"nargs": 0}),
        (IGNORED_OPTIONAL_VALUE, {"nargs": "?", "metavar": "X"}),
        (IGNORED_WITH_VALUE, {"metavar": "X"}),
    ):
        for word in words:
            i.add_argument(*word.split("|"), dest="ignored_flag", action=_Ignored, **kwargs)
    for spellings, what in UNSUPPORTED_FLAGS.items():
        p.add_argument(
            *spellings.split("|"), nargs="?", const=what, action=_Refused, help=argparse.SUPPRESS
        )
