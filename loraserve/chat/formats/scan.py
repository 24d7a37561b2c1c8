"""Low-level scanning of a model's partial output: JSON value spans that may still be
incomplete, the keys of a partial JSON object, and how much of a text's tail could still
grow into a marker (and so must be held back from a stream)."""

from __future__ import annotations

import json
import re
from typing import Any

_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
WS = " \t\n\r"


class Incomplete(Exception):
    """The text ends before the value does."""


class Invalid(Exception):
    """The text is not JSON at this point."""


def skip_ws(text: str, i: int) -> int:
    """The first non-whitespace position at or after `i`."""
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def value_end(text: str, i: int) -> int:
    """The end of the JSON value starting at `i` (no leading whitespace); Incomplete when the
    text ends inside it, Invalid when it is not JSON."""
    if i >= len(text):
        raise Incomplete
    c = text[i]
    if c == '"':
        j = i + 1
        while j < len(text):
            if text[j] == "\\":
                j += 2
                continue
            if text[j] == '"':
                return j + 1
            j += 1
        raise Incomplete
    if c in "{[":
        depth, j, in_str = 0, i, False
        while j < len(text):
            ch = text[j]
            if in_str:
                if ch == "\\":
                    j += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        raise Incomplete
    m = _SCALAR.match(text, i)
    if m is None:
        if any(w.startswith(text[i:]) for w in ("true", "false", "null")) or text[i:] == "-":
            raise Incomplete
        raise Invalid
    if m.end() == len(text):
        raise Incomplete  # a number may go on
    return m.end()


def object_members(text: str, i: int) -> tuple[list[tuple[str, int, int | None]], int | None]:
    """The members of the JSON object whose `{` is at `i`: (key, value start, value end or
    None when the text ends inside it) in order, and the object's end (None: incomplete).
    Invalid when it is not an object."""
    if i >= len(text) or text[i] != "{":
        raise Invalid
    out: list[tuple[str, int, int | None]] = []
    j = skip_ws(text, i + 1)
    if j < len(text) and text[j] == "}":
        return out, j + 1
    while True:
        if j >= len(text):
            return out, None
        if text[j] != '"':
            raise Invalid
        try:
            k_end = value_end(text, j)
        except Incomplete:
            return out, None
        key = json.loads(text[j:k_end])
        j = skip_ws(text, k_end)
        if j >= len(text):
            return out, None
        if text[j] != ":":
            raise Invalid
        v = skip_ws(text, j + 1)
        if v >= len(text):
            return out, None
        try:
            v_end = value_end(text, v)
        except Incomplete:
            out.append((key, v, None))
            return out, None
        out.append((key, v, v_end))
        j = skip_ws(text, v_end)
        if j >= len(text):
            return out, None
        if text[j] == "}":
            return out, j + 1
        if text[j] != ",":
            raise Invalid
        j = skip_ws(text, j + 1)


def loads(text: str) -> Any:
    """json.loads, Invalid on error."""
    try:
        return json.loads(text)
    except ValueError:
        raise Invalid from None


def held(text: str, markers: tuple[str, ...] | list[str]) -> int:
    """How many trailing characters of `text` could be the start of one of `markers`."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[len(text) - n :]):
                best = n
                break
    return best
