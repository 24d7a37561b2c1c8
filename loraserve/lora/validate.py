"""An adapter checked from its headers before any of its weights is read: a GGUF LoRA's pairs
(names, ranks, shapes against the base model, alpha) and a PEFT folder's
``adapter_config.json`` (bounded size and nesting, rank and alpha values, and its
``rank_pattern`` / ``alpha_pattern`` regexes, refused unless they match in bounded time).

Every refusal is an `AdapterError` naming the file and the problem: a run-time load answers it
as a 400, a start-up load as one line. Python's own errors on crafted input (RecursionError on
deep JSON, ZeroDivisionError on a zero rank, TypeError on a value of another type,
``re.error`` on a bad pattern) are turned into that one error here, never raised as such.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loraserve.lora.adapter import AdapterError

MAX_RANK = 1 << 16
MAX_ALPHA = 1e6  # |alpha|: a factor beyond alpha / rank of 1e6 is no adapter
MAX_CONFIG_BYTES = 1 << 20  # adapter_config.json
MAX_JSON_DEPTH = 32
MAX_PATTERNS = 256  # entries of rank_pattern + alpha_pattern
MAX_PATTERN_CHARS = 512
MAX_KEY_CHARS = 512  # a module name matched against the patterns
# unbounded repeats a pattern may hold (with the `(.*\.)?` PEFT puts before it, matching is at
# worst polynomial of degree this + 1 in the module name's length)
MAX_PATTERN_REPEATS = 2

Shape = tuple[int, ...]


# ---- GGUF LoRA ---------------------------------------------------------------------------


def gguf_pairs(
    path: Path, shapes: Mapping[str, Shape], base_shapes: Mapping[str, Shape] | None
) -> dict[str, int]:
    """A GGUF LoRA's tensor table (name -> torch-order shape) as pairs: every ``X.lora_a``
    with its ``X.lora_b``, A [r, in] and B [out, r] (experts: a leading [E]) of one rank,
    fitting base tensor X of ``base_shapes`` (when given). Returns target -> rank;
    `AdapterError` naming the first tensor that does not fit. Norm vectors are ignored, as
    llama.cpp ignores them."""
    halves: dict[str, dict[str, Shape]] = {}
    for name, shape in shapes.items():
        base, _, part = name.rpartition(".")
        if part not in ("lora_a", "lora_b"):
            if name.endswith("_norm.weight"):
                continue
            raise AdapterError(f"{path}: tensor {name!r} is neither .lora_a nor .lora_b")
        halves.setdefault(base, {})[part] = tuple(shape)
    ranks = {}
    for base, ab in halves.items():
        if len(ab) != 2:
            missing = "lora_b" if "lora_a" in ab else "lora_a"
            raise AdapterError(f"{path}: {base}.{missing} is missing (its pair is present)")
        ranks[base] = check_pair(path, base, ab["lora_a"], ab["lora_b"], base_shapes)
    return ranks


def check_pair(
    path: Path, target: str, a: Shape, b: Shape, base_shapes: Mapping[str, Shape] | None
) -> int:
    """One target's A and B shapes (torch order) against each other and, when given, the base
    tensor: same rank (1 to `MAX_RANK`), A's width the base's input, B's rows its output.
    Returns the rank; `AdapterError` otherwise."""
    if len(a) != len(b) or len(a) not in (2, 3) or a[:-2] != b[:-2]:
        raise AdapterError(f"{path}: LoRA for {target!r} has A {a} and B {b}: not a pair")
    if a[-2] != b[-1]:
        raise AdapterError(
            f"{path}: LoRA for {target!r} has rank {a[-2]} in A {a} but {b[-1]} in B {b}"
        )
    if not 1 <= a[-2] <= MAX_RANK:
        raise AdapterError(f"{path}: LoRA for {target!r} has rank {a[-2]} (1 to {MAX_RANK})")
    if base_shapes is None:
        return a[-2]
    if target == "token_embd.weight":
        raise AdapterError(f"{path}: a LoRA on {target!r} (token embeddings) is not supported")
    base = base_shapes.get(target)
    if base is None:
        raise AdapterError(f"{path}: LoRA target {target!r} does not exist in the base model")
    if len(base) != len(a) or base[:-2] != a[:-2] or a[-1] != base[-1] or b[-2] != base[-2]:
        raise AdapterError(
            f"{path}: LoRA for {target!r} has A {a} and B {b}, which do not fit the base "
            f"tensor {tuple(base)} (A [r, in], B [out, r]): an adapter for another base model"
        )
    return a[-2]


def check_alpha(path: Path, alpha: Any) -> float:
    """A LoRA alpha: a finite number of magnitude at most `MAX_ALPHA` (0: none)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) and not _np_number(alpha):
        raise AdapterError(f"{path}: LoRA alpha {alpha!r} is not a number")
    value = float(alpha)
    if not (math.isfinite(value) and abs(value) <= MAX_ALPHA):
        raise AdapterError(f"{path}: LoRA alpha {value} (finite, at most {MAX_ALPHA:g})")
    return value


def _np_number(v: Any) -> bool:
    import numpy as np

    return isinstance(v, np.number) and not isinstance(v, np.bool_)


# ---- PEFT --------------------------------------------------------------------------------


def read_peft_config(path: Path) -> dict[str, Any]:
    """A PEFT folder's ``adapter_config.json``, bounded (size, nesting) and checked: ``r`` a
    rank, ``lora_alpha`` a sane alpha, the pattern fields dicts of bounded patterns to values
    of the right kind. `AdapterError` otherwise."""
    f = path / "adapter_config.json"
    try:
        size = f.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise AdapterError(f"{f}: {size} bytes (at most {MAX_CONFIG_BYTES})")
        text = f.read_bytes().decode("utf-8")
        _check_depth(f, text)
        conf = json.loads(text)
    except AdapterError:
        raise
    except (OSError, ValueError, RecursionError) as e:
        raise AdapterError(f"{f}: unreadable JSON: {type(e).__name__}: {e}") from None
    if not isinstance(conf, dict):
        raise AdapterError(f"{f}: not a JSON object")
    rank = conf.get("r", 8)
    if not _is_int(rank) or not 1 <= rank <= MAX_RANK:
        raise AdapterError(f"{f}: r = {rank!r} (an integer from 1 to {MAX_RANK})")
    check_alpha(f, conf.get("lora_alpha", 8))
    n = 0
    for field_name, check in (("rank_pattern", "rank"), ("alpha_pattern", "alpha")):
        patterns = conf.get(field_name) or {}
        if not isinstance(patterns, dict):
            raise AdapterError(f"{f}: {field_name} must be an object of pattern -> value")
        n += len(patterns)
        if n > MAX_PATTERNS:
            raise AdapterError(f"{f}: more than {MAX_PATTERNS} rank/alpha patterns")
        for pat, value in patterns.items():
            compile_pattern(f, pat)
            if check == "rank" and not (_is_int(value) and 1 <= value <= MAX_RANK):
                raise AdapterError(f"{f}: {field_name}[{pat!r}] = {value!r} is not a rank")
            if check == "alpha":
                check_alpha(f, value)
    return conf


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_depth(f: Path, text: str) -> None:
    """Refuse JSON nested deeper than `MAX_JSON_DEPTH` before parsing it (brackets inside
    strings counted too: a bound, not a parse)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    if deepest > MAX_JSON_DEPTH:
        raise AdapterError(f"{f}: JSON nested {deepest} deep (at most {MAX_JSON_DEPTH})")


_COMPILED: dict[str, re.Pattern[str]] = {}


def compile_pattern(where: Path, pat: Any) -> re.Pattern[str]:
    """A PEFT module pattern as PEFT matches it (``(.*\\.)?(PAT)$`` from the start of the
    module name), compiled only if its matching time is bounded: at most
    `MAX_PATTERN_CHARS` characters, no backreference, at most `MAX_PATTERN_REPEATS`
    unbounded repeats, none nested in another repeat and no alternation under one (the
    forms that backtrack exponentially, e.g. ``(a+)+$`` or ``(a|a)*$``). `AdapterError`
    for any other pattern or one that does not compile."""
    if not isinstance(pat, str) or not pat or len(pat) > MAX_PATTERN_CHARS:
        raise AdapterError(f"{where}: pattern {str(pat)[:60]!r} (1 to {MAX_PATTERN_CHARS} chars)")
    cached = _COMPILED.get(pat)
    if cached is not None:
        return cached
    try:
        from re import _parser  # type: ignore[attr-defined]

        tree = _parser.parse(pat)
        repeats = _repeats(tree, under_repeat=False)
        compiled = re.compile(rf"(.*\.)?({pat})$")
    except (re.error, RecursionError, OverflowError, ValueError) as e:
        raise AdapterError(f"{where}: pattern {pat[:60]!r} does not compile: {e}") from None
    except _Unbounded as e:
        raise AdapterError(
            f"{where}: pattern {pat[:60]!r} refused: {e} (its matching time would be unbounded)"
        ) from None
    if repeats > MAX_PATTERN_REPEATS:
        raise AdapterError(
            f"{where}: pattern {pat[:60]!r} refused: {repeats} unbounded repeats (at most "
            f"{MAX_PATTERN_REPEATS})"
        )
    if len(_COMPILED) < 4096:
        _COMPILED[pat] = compiled
    return compiled


class _Unbounded(Exception):
    pass


def _repeats(items: Any, under_repeat: bool) -> int:
    """Unbounded repeats in a parsed pattern; raises `_Unbounded` for a repeat inside a
    repeat, an alternation under a repeat, or a backreference."""
    from re import _constants as c  # type: ignore[attr-defined]

    n = 0
    for op, av in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            if under_repeat and hi > 1:
                raise _Unbounded("a repeat inside a repeat")
            n += (hi == c.MAXREPEAT) + _repeats(sub, under_repeat or hi > 1)
        elif op in (c.GROUPREF, c.GROUPREF_EXISTS):
            raise _Unbounded("a backreference")
        elif op == c.BRANCH:
            if under_repeat:
                raise _Unbounded("an alternation under a repeat")
            n += sum(_repeats(b, under_repeat) for b in av[1])
        elif op == c.SUBPATTERN:
            n += _repeats(av[-1], under_repeat)
        elif op in (c.ASSERT, c.ASSERT_NOT):
            n += _repeats(av[1], under_repeat)
        elif op == getattr(c, "ATOMIC_GROUP", None):
            n += _repeats(av, under_repeat)
    return n


def pattern_value(conf: dict[str, Any], field_name: str, key: str, default: Any) -> Any:
    """PEFT's rank/alpha pattern value for module ``key`` (the first matching pattern wins),
    with the patterns `read_peft_config` checked; `AdapterError` for a module name past
    `MAX_KEY_CHARS`."""
    patterns = conf.get(field_name) or {}
    if patterns and len(key) > MAX_KEY_CHARS:
        raise AdapterError(f"module name of {len(key)} characters (at most {MAX_KEY_CHARS})")
    for pat, value in patterns.items():
        if compile_pattern(Path(field_name), pat).match(key):
            return value
    return default


# ---- headers only (start-up pre-flight) --------------------------------------------------

_PEFT_PART = re.compile(r"^(.+)\.(lora_A|lora_B)(?:\.weight)?$")


def check_header(path: Path, base_shapes: Mapping[str, Shape] | None) -> None:
    """An adapter's pairs and configuration from its headers alone (GGUF tensor table, or
    a PEFT folder's adapter_config.json and safetensors header): ranks consistent, alpha
    sane, patterns bounded, and for GGUF every pair against ``base_shapes``. PEFT names are
    mapped to the base by the loader, which checks them against it."""
    if path.is_dir():
        conf = read_peft_config(path)
        from safetensors import safe_open

        try:
            with safe_open(str(path / "adapter_model.safetensors"), "pt") as st:
                dims = {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
        except Exception as e:  # safetensors raises its own error types on corrupt files
            raise AdapterError(f"{path}: unreadable adapter_model.safetensors: {e}") from None
        halves: dict[str, dict[str, Shape]] = {}
        for key, shape in dims.items():
            m = _PEFT_PART.match(key)
            if m is not None:
                halves.setdefault(m.group(1), {})[m.group(2)] = shape
        for module, ab in halves.items():
            if len(ab) == 2:
                check_pair(path, module, ab["lora_A"], ab["lora_B"], None)
        del conf
        return
    from loraserve.lora.adapter_gguf import AdapterGGUF

    try:
        with AdapterGGUF(path) as gg:
            shapes = {n: i.shape for n, i in gg.tensors.items()}
            alpha = gg.metadata.get("adapter.lora.alpha", 0.0)
    except (ValueError, OSError) as e:
        raise AdapterError(f"cannot read GGUF LoRA {path}: {e}") from None
    check_alpha(path, alpha)
    gguf_pairs(path, shapes, base_shapes)
