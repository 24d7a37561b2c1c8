"""Scanning helpers shared by the specialised formats' parsers: a cursor over the answer
that raises `Need` where the text ends before something can be decided, and the tagged
arguments' JSON text built as it streams (only ever growing)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loraserve.chat.formats.scan import Incomplete, Invalid, held, skip_ws, value_end
from loraserve.chat.formats.values import types_of

WS = " \t\n\r"


class Need(Exception):
    """The text ends before this can be decided."""


@dataclass
class Parsed:
    """What a specialised parser found: content, reasoning, calls as [name, args, id]."""

    content: str = ""
    reasoning: str = ""
    calls: list[list[str]] = field(default_factory=list)

    def call(self, name: str, id_: str = "") -> list[str]:
        """A new call of `name`, its arguments empty so far."""
        self.calls.append([name, "", id_])
        return self.calls[-1]


def lit(text: str, i: int, marker: str, ws: bool = True) -> int:
    """Past `marker` at `i` (whitespace before it skipped with `ws`); Need when the text
    ends inside it, Invalid when something else is there."""
    j = skip_ws(text, i) if ws else i
    if text.startswith(marker, j):
        return j + len(marker)
    if marker.startswith(text[j:]):
        raise Need
    raise Invalid


def opt(text: str, i: int, marker: str, ws: bool = True) -> int:
    """Past `marker` when it is at `i`, else `i` (Need when the text ends inside it)."""
    try:
        return lit(text, i, marker, ws)
    except Invalid:
        return i


def at(text: str, i: int, marker: str) -> bool:
    """Whether `marker` starts at `i`; Need when the text ends inside it."""
    if text.startswith(marker, i):
        return True
    if i < len(text) and marker.startswith(text[i:]) or i >= len(text):
        raise Need
    return False


def until(text: str, i: int, stops: tuple[str, ...], partial: bool) -> tuple[str, int, str]:
    """The text from `i` to the first of `stops`: (body, the stop's position, the stop).
    Without a stop: a partial text's body without what may start one, position -1, stop ""
    (a whole text's body runs to its end)."""
    found = [(text.find(s, i), s) for s in stops]
    found = [(k, s) for k, s in found if k >= 0]
    if found:
        k, s = min(found)
        return text[i:k], k, s
    body = text[i:]
    if partial:
        body = body[: len(body) - held(body, stops)]
    return body, -1, ""


def name_until(text: str, i: int, stop: str) -> tuple[str, int]:
    """A name from `i` up to `stop`: (name, position after `stop`); Need without `stop`."""
    k = text.find(stop, i)
    if k < 0:
        raise Need
    return text[i:k].strip(), k + len(stop)


def read_reasoning(
    text: str, i: int, end: str, cut: tuple[str, ...], partial: bool, out: Parsed, extract: bool
) -> int:
    """Reads a reasoning block from `i` (past its opening marker) up to `end`, or up to one of
    `cut` (markers that end it early and are read next): into `out.reasoning` with `extract`,
    else into `out.content`. Where to go on; -1 when the text ends first."""
    body, k, stop = until(text, i, (end, *cut), partial)
    if extract:
        out.reasoning = body
    else:
        out.content = body
    if k < 0:
        return -1
    return k + len(end) if stop == end else k


def content_before(text: str, i: int, start: str | None, partial: bool, out: Parsed) -> int:
    """Sets `out.content` to the text from `i` up to the calls' `start` marker (all of it
    when `start` is None: calls are not parsed). Past `start`; -1 where it is not there."""
    body, k, _ = until(text, i, () if start is None else (start,), partial)
    out.content = body
    return -1 if k < 0 or start is None else k + len(start)


def json_value(text: str, i: int) -> tuple[str, int]:
    """The JSON value at `i` (whitespace skipped): (its text, its end); Need while the text
    ends inside it."""
    v = skip_ws(text, i)
    try:
        return text[v : value_end(text, v)], value_end(text, v)
    except Incomplete:
        raise Need from None


class Args:
    """The JSON object text of a call's arguments, built member by member: it only grows
    while the text streams, a string value's characters joining as they come."""

    def __init__(self, call: list[str]) -> None:
        self.call = call
        self.n = 0

    def key(self, key: str) -> None:
        """Start the member `key`."""
        head = "{" if self.n == 0 else ", "
        self.call[1] += head + json.dumps(key, ensure_ascii=False) + ": "
        self.n += 1

    def value(self, value_json: str) -> None:
        """The member's value, as JSON text."""
        self.call[1] += value_json

    def string(self, raw: str, closed: bool) -> None:
        """The member's string value `raw` (so far, when not `closed`)."""
        self.call[1] += json.dumps(raw, ensure_ascii=False)[: None if closed else -1]

    def close(self) -> None:
        """The object's end."""
        self.call[1] = (self.call[1] or "{") + "}"


def args_end(text: str, i: int, args: Args, end: str) -> tuple[int, bool]:
    """Whitespace skipped from `i`: where `end` is, `args` closed and (past `end`, True),
    else (the next argument's start, False)."""
    j = skip_ws(text, i)
    if at(text, j, end):
        args.close()
        return j + len(end), True
    return j, False


def next_invoke(text: str, i: int, end: str, invoke: str, out: Parsed) -> tuple[Args | None, int]:
    """Whitespace skipped from `i`: where the calls' `end` is, (None, past it); else the call
    `invoke` opens (its name up to `">`) added to `out`: (its arguments, their start)."""
    j = skip_ws(text, i)
    if at(text, j, end):
        return None, j + len(end)
    name, i = name_until(text, lit(text, j, invoke), '">')
    return Args(out.call(name)), i


def properties(schemas: dict, name: str) -> dict:
    """The parameter schemas by name of the tool `name` ({} when unknown)."""
    return (schemas.get(name) or {}).get("properties") or {}


def raw_arg(text: str, i: int, end: str, args: Args, convert: Callable[[str], str] | None) -> int:
    """The argument value from `i` up to `end`: streamed as a string when `convert` is None,
    else joined once `end` is there as `convert(raw text)` (JSON). Past `end`; Need before."""
    raw, k, _ = until(text, i, (end,), True)
    if convert is None:
        args.string(raw, k >= 0)
    elif k >= 0:
        args.value(convert(raw))
    if k < 0:
        raise Need
    return k + len(end)


def json_or(raw: str, fallback: str | None) -> str:
    """`raw` re-encoded as JSON when it parses as JSON, else `fallback` as a JSON string
    (Invalid when `fallback` is None)."""
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False)
    except ValueError:
        if fallback is None:
            raise Invalid from None
        return json.dumps(fallback, ensure_ascii=False)


def may_be_string(schema: Any) -> bool:
    """Whether the schema allows a string (or says nothing of the type)."""
    types = types_of(schema)
    return not types or "string" in types


__all__ = ["WS", "Args", "Invalid", "Need", "Parsed", "args_end", "at", "content_before",
           "held", "json_or", "json_value", "lit", "may_be_string", "name_until", "next_invoke",
           "opt", "properties", "raw_arg", "read_reasoning", "skip_ws", "types_of",
           "until"]  # fmt: skip
