"""Low-level scanning of a model's partial output: JSON value spans that may still be
incomplete, the keys of a partial JSON object, and how much of a text's tail could still
grow into a marker (and so must be held back from a stream)."""

from __future__ import annotations

import json
import re
from typing import Any

_BODY = r'(?:[^"\\]++|\\.)*+'  # a string's inside, possessive: runs of plain characters at once
_STRING = re.compile(rf'"{_BODY}"', re.S)
_TOKENS = re.compile(rf'"{_BODY}(?P<open>\\?\Z)?"?|[{{}}\[\]]', re.S)
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
        m = _STRING.match(text, i)
        if m is None:
            raise Incomplete
        return m.end()
    if c in "{[":
        depth = 0
        for m in _TOKENS.finditer(text, i):  # strings skipped whole, at C speed
            tok = m.group(0)
            if tok in "{[":
                depth += 1
            elif tok in "}]":
                depth -= 1
                if depth == 0:
                    return m.end()
            elif m.group("open") is not None or not tok.endswith('"') or len(tok) < 2:
                raise Incomplete  # a string the text ends inside
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
        key = loads(text[j:k_end])
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
