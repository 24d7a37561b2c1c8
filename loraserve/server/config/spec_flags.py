"""Speculative decoding flags, named as llama-server names them (common/arg.cpp of the
llama.cpp in the llama-cpp-python 0.3.36 sdist): `--spec-type`, the n-gram and draft-model
settings, `-md`, and the removed flags answered with their replacement's name.

`config` turns the parsed namespace into the engine's `SpecConfig`. ``-md`` without a
`--spec-type` means `draft-simple`; `draft-simple` without ``-md`` is refused.
"""

from __future__ import annotations

import argparse
from typing import Any

from loraserve.engine.spec.config import ALL_TYPES, SpecConfig, parse_types

# (flags, the message after "the argument has been removed. "), as llama-server's
REMOVED = (
    ("--draft|--draft-n|--draft-max", "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
    ("--draft-min|--draft-n-min", "use --spec-draft-n-min or --spec-ngram-mod-n-min"),
    ("--spec-ngram-size-n", "use the respective --spec-ngram-*-size-n"),
    ("--spec-ngram-size-m", "use the respective --spec-ngram-*-size-m"),
    ("--spec-ngram-min-hits", "use the respective --spec-ngram-*-min-hits"),
)
# draft-model tuning for llama.cpp's devices and threads, and the types loraserve lacks
IGNORED = """
    --spec-draft-hf|-hfd|-hfrd|--hf-repo-draft --spec-draft-threads|-td|--threads-draft
    --spec-draft-threads-batch|-tbd|--threads-batch-draft --spec-draft-cpu-mask|-Cd
    --spec-draft-cpu-range|-Crd --spec-draft-cpu-strict --spec-draft-prio --spec-draft-poll
    --spec-draft-type-k|-ctkd|--cache-type-k-draft --spec-draft-type-v|-ctvd|--cache-type-v-draft
    --spec-draft-override-tensor|-otd|--override-tensor-draft
    --spec-draft-n-cpu-moe|--spec-draft-ncmoe|-ncmoed|--n-cpu-moe-draft
    --spec-draft-p-split|--draft-p-split --spec-draft-device|-devd|--device-draft
    --spec-draft-ngl|-ngld|--gpu-layers-draft|--n-gpu-layers-draft
    --spec-ngram-map-k-size-n --spec-ngram-map-k-size-m --spec-ngram-map-k-min-hits
    --spec-ngram-map-k4v-size-n --spec-ngram-map-k4v-size-m --spec-ngram-map-k4v-min-hits
""".split()
IGNORED_SWITCHES = "--spec-draft-cpu-moe|-cmoed|--cpu-moe-draft".split()


class _Removed(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        parser.error(f"argument {option_string}: the argument has been removed. {self.const}")


class _Ignored(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        namespace.ignored = [*namespace.ignored, option_string]


class _Types(argparse.Action):
    """`--spec-type A,B` (repeatable: the lists add up, as in llama-server)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        try:
            types = parse_types(values)
        except ValueError as e:
            parser.error(f"argument {option_string}: {e}")
        namespace.spec_types = () if not types else (*namespace.spec_types, *types)


class _Default(argparse.Action):
    """`--spec-default`: ngram-mod with n-match 24, n-min 48, n-max 64."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        namespace.spec_types = (*namespace.spec_types, "ngram-mod")
        namespace.spec_ngram_mod_n_match = 24
        namespace.spec_ngram_mod_n_min = 48
        namespace.spec_ngram_mod_n_max = 64


def _int(low: int, high: int | None, message: str) -> Any:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low or (high is not None and v > high):
            raise argparse.ArgumentTypeError(message)
        return v

    return parse


def _prob(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def add_flags(p: argparse.ArgumentParser) -> None:
    """Register the speculative-decoding flags on the server's parser."""
    d = SpecConfig()
    g = p.add_argument_group("speculative decoding (exact: answers never change)")
    a = g.add_argument
    a(
        "--spec-type",
        dest="spec_types",
        action=_Types,
        metavar="TYPES",
        help=f"comma-separated types (of {', '.join(ALL_TYPES)}; loraserve implements "
        "ngram-simple, ngram-mod, draft-simple) (default: none)",
    )
    a("--spec-default", nargs=0, action=_Default, help="ngram-mod, n-match 24, n-min 48, n-max 64")
    a(
        "--spec-draft-model",
        "-md",
        "--model-draft",
        dest="spec_draft_model",
        metavar="FNAME",
        help="draft model with the model's vocabulary (implies --spec-type draft-simple)",
    )
    n_max_help = f"tokens to draft (default: {d.draft_n_max})"
    a("--spec-draft-n-max", type=_int(0, None, "invalid value"), metavar="N", help=n_max_help)
    a(
        "--spec-draft-n-min",
        type=_int(-(2**31), None, "invalid value"),
        metavar="N",
        help=f"a shorter draft is dropped (default: {d.draft_n_min})",
    )
    a(
        "--spec-draft-p-min",
        "--draft-p-min",
        type=_prob,
        metavar="P",
        help=f"draft-model greedy probability floor (default: {d.draft_p_min:.2f})",
    )
    for name, default, low, msg in (
        ("n-min", d.ngram_mod_n_min, 0, "ngram n-min must be between 0 and 1024 inclusive"),
        ("n-max", d.ngram_mod_n_max, 0, "ngram n-max must be between 0 and 1024 inclusive"),
        ("n-match", d.ngram_mod_n_match, 1, "ngram size N must be between 1 and 1024 inclusive"),
    ):
        a(
            f"--spec-ngram-mod-{name}",
            type=_int(low, 1024, msg),
            metavar="N",
            help=f"ngram-mod {name} (default: {default})",
        )
    for name, default, msg in (
        ("size-n", d.ngram_simple_size_n, "ngram size N must be between 1 and 1024 inclusive"),
        ("size-m", d.ngram_simple_size_m, "ngram size M must be between 1 and 1024 inclusive"),
    ):
        a(
            f"--spec-ngram-simple-{name}",
            type=_int(1, 1024, msg),
            metavar="N",
            help=f"ngram-simple {name} (default: {default})",
        )
    a(
        "--spec-ngram-simple-min-hits",
        type=_int(1, None, "ngram min hits must be at least 1"),
        metavar="N",
        help=f"ngram-simple min hits (default: {d.ngram_simple_min_hits})",
    )
    for spellings, message in REMOVED:
        p.add_argument(
            *spellings.split("|"), nargs="?", const=message, action=_Removed, help=argparse.SUPPRESS
        )
    for words, nargs in ((IGNORED, None), (IGNORED_SWITCHES, 0)):
        for word in words:
            p.add_argument(
                *word.split("|"),
                dest="ignored_flag",
                action=_Ignored,
                nargs=nargs,
                help=argparse.SUPPRESS,
            )
    p.set_defaults(spec_types=(), spec_draft_model=None)


def config(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> SpecConfig:
    """The parsed flags as the engine's `SpecConfig` (unset flags keep its defaults)."""
    d = SpecConfig()
    types = tuple(dict.fromkeys(ns.spec_types))
    if ns.spec_draft_model and not types:
        types = ("draft-simple",)
    if "draft-simple" in types and not ns.spec_draft_model:
        parser.error("argument --spec-type: draft-simple needs a draft model (-md FNAME)")
    if ns.spec_draft_p_min is not None and not 0.0 <= ns.spec_draft_p_min <= 1.0:
        parser.error(f"argument --spec-draft-p-min: must be in [0, 1], got {ns.spec_draft_p_min}")

    def get(name: str, default: Any) -> Any:
        value = getattr(ns, f"spec_{name}", None)
        return default if value is None else value

    return SpecConfig(
        types=parse_types(",".join(types)) if types else (),
        draft_model=ns.spec_draft_model,
        draft_n_max=get("draft_n_max", d.draft_n_max),
        draft_n_min=get("draft_n_min", d.draft_n_min),
        draft_p_min=get("draft_p_min", d.draft_p_min),
        ngram_simple_size_n=get("ngram_simple_size_n", d.ngram_simple_size_n),
        ngram_simple_size_m=get("ngram_simple_size_m", d.ngram_simple_size_m),
        ngram_simple_min_hits=get("ngram_simple_min_hits", d.ngram_simple_min_hits),
        ngram_mod_n_match=get("ngram_mod_n_match", d.ngram_mod_n_match),
        ngram_mod_n_min=get("ngram_mod_n_min", d.ngram_mod_n_min),
        ngram_mod_n_max=get("ngram_mod_n_max", d.ngram_mod_n_max),
    )
