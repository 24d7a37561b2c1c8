"""Router-mode flags, named as llama-server names them (`--models-dir`, `--models-preset`,
`--models-max`, `--models-autoload` / `--no-models-autoload`; common/arg.cpp of the llama.cpp
in the llama-cpp-python 0.3.36 sdist), served by `server/router/`.

Router mode is entered when no `-m` is given, as llama-server does (its README: "launch
`llama-server` without specifying any model"). Where llama-server's router lists its download
cache, loraserve's lists the default model (its package installed; with the demo adapters at
scale 0, as a single-model start loads them) beside `--models-dir` and `--models-preset`; a
request that names no model goes to the one model when the router has only one (ours: so the
README's one-command start, `loraserve` and a `curl` without `model`, works unchanged).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from loraserve.server.config.arg_types import int_in

DEFAULT_MODELS_MAX = 4  # llama-server's default; 0 = unlimited


class _RouterFlag(argparse.Action):
    """Stores the value and notes that a router flag was given (router mode without -m)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        if option_string in ("--models-autoload", "--no-models-autoload"):
            values = option_string == "--models-autoload"
        setattr(namespace, self.dest, values)
        namespace.router_flag_seen = True


def add_flags(p: argparse.ArgumentParser) -> None:
    """Register the router flags (their defaults come from `ServerConfig`)."""
    g = p.add_argument_group("router mode (no -m): several models and presets")
    a = g.add_argument
    a(
        "--models-dir",
        action=_RouterFlag,
        metavar="PATH",
        help="directory of GGUF models (a file, or a folder holding one) for the router",
    )
    a(
        "--models-preset",
        action=_RouterFlag,
        metavar="FILE.ini",
        help="INI presets: a section per preset, keys = flags without dashes, [*] global",
    )
    a(
        "--models-max",
        action=_RouterFlag,
        type=int_in(0),
        metavar="N",
        help=f"engines loaded at once, least recently used unloaded past it, 0 = unlimited "
        f"(default: {DEFAULT_MODELS_MAX})",
    )
    a(
        "--models-autoload",
        "--no-models-autoload",
        action=_RouterFlag,
        nargs=0,
        help="load a model on its first request (default: on)",
    )


def config(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The `ServerConfig` values of the router flags; `router` is True without `-m`. A
    missing directory or preset file is a usage error."""
    for flag, path, isdir in (
        ("--models-dir", ns.models_dir, True),
        ("--models-preset", ns.models_preset, False),
    ):
        if path is not None and not (os.path.isdir(path) if isdir else os.path.isfile(path)):
            what = "a directory" if isdir else "a file"
            parser.error(f"argument {flag}: not {what}: {path!r}")
    return {
        "router": ns.model is None,
        "models_dir": ns.models_dir,
        "models_preset": ns.models_preset,
        "models_max": ns.models_max,
        "models_autoload": ns.models_autoload,
    }
