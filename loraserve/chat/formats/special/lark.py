"""llguidance Lark building blocks for the dialect grammars: markers as text or as named
special tokens, free text up to a marker, embedded JSON values spaced as templates write
them, and a tool's arguments (schema order, or any order)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

SPACE = r"( |\n{1,2}[ \t]{0,20})?"  # llama.cpp's json-schema-to-grammar `space`, bounded
# JSON values as llama.cpp's schema grammars space them: `space` after `{`, `[`, `,`, `:`
# and every value, so both `{"a":1}` and a template's indented `{\n    "a": 1\n}` pass
# and `\uXXXX` escapes as its `char` rule takes them (templates' ASCII-only `tojson`)
STYLE = {"whitespace_flexible": True, "whitespace_pattern": SPACE, "item_separator": ",",
         "key_separator": ":", "json_allow_general_unicode_escapes": True}  # fmt: skip
REPEATS = 4  # optional arguments written again beyond each one once (`optional_runs`)
NUMBER = r"/-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][-+]?[0-9]{1,3})?/"  # bounded digits


class Lark:
    """Rules under construction; markers that are special tokens written as `<token>`."""

    def __init__(self, special: Callable[[str], bool], pieces: tuple[str, ...] = ()) -> None:
        self.special = special
        self.pieces = pieces  # special tokens that sit inside longer markers (｜DSML｜)
        self.rules: list[str] = []
        self.named: dict[str, str] = {}

    def q(self, text: str) -> str:
        """`text` as grammar items, its special tokens as token references (llguidance names
        a token by its text when that is `<..>`; any other special token stays text)."""
        for piece in (text, *self.pieces):
            if piece and piece in text and named(piece) and self.special(piece):
                head, _, tail = text.partition(piece)
                items = (self.q(head) if head else "", piece, self.q(tail) if tail else "")
                return " ".join(x for x in items if x)
        return json.dumps(text)

    def rule(self, body: str, lazy: bool = False) -> str:
        name = f"d{len(self.rules) + 1}"
        self.rules.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def text_until(self, end: str) -> str:
        """Free text up to and including `end` (text never holds a special token, so one
        ends it without a lazy rule, which may hold none)."""
        marker = self.q(end)
        return self.rule(f"TEXT {marker}", lazy=marker.startswith('"'))

    def reasoning_until(self, end: str, stops: tuple[str, ...] = ()) -> str:
        """A reasoning block's text up to and including its `end`: as `text_until`, and
        where markers are special tokens, the dialect's other special tokens may sit inside
        (a trigger written inside reasoning is the reasoning's, as llama.cpp's lazy grammar
        ignores it there), except `stops`, which end the reasoning themselves."""
        marker = self.q(end)
        inner = [p for p in self.pieces if p not in (end, *stops) and named(p)
                 and self.special(p)]  # fmt: skip
        if marker.startswith('"') or not inner:
            return self.text_until(end)
        return self.rule(f"TEXT (({' | '.join(inner)}) TEXT)* {marker}")

    def text_head(self, marker: str) -> str:
        """The part of `marker` before its first special token (all of it when none)."""
        starts = [marker.find(p) for p in self.pieces if p and p in marker and named(p)
                  and self.special(p)]  # fmt: skip
        return marker[: min(starts)] if starts else marker

    def string_until(self, schema: Any, end: str) -> str:
        """A raw string value up to and past `end`: as the schema bounds it (enum, maxLength),
        else any text."""
        schema = schema if isinstance(schema, dict) else {}
        if schema.get("enum") and all(isinstance(v, str) for v in schema["enum"]):
            return f"({' | '.join(json.dumps(v) for v in schema['enum'])}) {self.q(end)}"
        top = schema.get("maxLength")
        if not isinstance(top, int):
            return self.text_until(end)
        low = schema.get("minLength", 0)
        name = f"T{len(self.rules) + 1}"
        low = low if isinstance(low, int) else 0
        self.rules.append(f"{name}: /(.|\\n){{{low},{top}}}/ & ~/(.|\\n)*{_rx(end)}(.|\\n)*/")
        return f"{name} {self.q(end)}"

    def not_containing(self, *markers: str) -> str:
        """A terminal of free text that never holds any of `markers` (a lazy grammar's text
        before its trigger)."""
        name = f"T{len(self.rules) + 1}"
        avoid = "".join(f" & ~/(.|\\n)*{_rx(m)}(.|\\n)*/" for m in markers if m)
        self.rules.append(f"{name}: /(.|\\n)*/{avoid}")
        return name

    def lark(self, start: str) -> str:
        head = ["%llguidance {}", f"start: {start}", f"WS: /{SPACE}/", r"TEXT: /(.|\n)*/",
                r"SP: /[ \n]{0,12}/"]  # fmt: skip
        return "\n".join(head + self.rules) + "\n"


def named(token: str) -> bool:
    inner = token[1:-1]
    return token.startswith("<") and token.endswith(">") and "<" not in inner and ">" not in inner


def _rx(text: str) -> str:
    rx = "".join("\\" + c if c in "\\.+*?()|[]{}^$/" else c for c in text)
    return rx.replace("\n", "\\n")


def integer(schema: Any) -> str:
    """An integer as the schema bounds it: each value of a small range, else bounded digits."""
    schema = schema if isinstance(schema, dict) else {}
    low, top = schema.get("minimum"), schema.get("maximum")
    if isinstance(low, int) and isinstance(top, int) and 0 <= top - low <= 256:
        return "(" + " | ".join(f'"{v}"' for v in range(low, top + 1)) + ")"
    return "/-?(0|[1-9][0-9]{0,15})/"


def json_value(schema: Any) -> str:
    return "%json " + json.dumps({"x-guidance": STYLE, **(schema or {})})


def closed(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("properties") and "additionalProperties" not in params:
        return {**params, "additionalProperties": False}
    return params


def optional_runs(n: int) -> int:
    """How many optional arguments may follow one another: each of the `n` once, and
    `REPEATS` more (llama.cpp's grammars take any number, keys repeating; a bound lets a
    random model that keeps repeating one reach the call's end)."""
    return n + REPEATS


def members(g: Lark, params: dict[str, Any], member: Callable[[str, Any], str], sep: str) -> str:
    """The arguments: the required ones in the schema's order, then the optional ones in any
    order, keys repeating (llama.cpp's `repeat(space + any_optional, 0, -1)`, bounded by
    `optional_runs`), `sep` between."""
    props = params.get("properties") or {}
    required = [k for k in props if k in (params.get("required") or [])]
    head = f" {sep} ".join(member(k, props[k]) for k in required)
    opt = [member(k, props[k]) for k in props if k not in required]
    if not opt:
        return head
    anyone, most = g.rule(" | ".join(opt)), optional_runs(len(opt))
    if not head:  # no first member to hang the separators on
        return f"({anyone} ({sep} {anyone}){{0,{most - 1}}})?"
    return f"{head} ({sep} {anyone}){{0,{most}}}"


def any_order(
    g: Lark, params: dict[str, Any], member: Callable[[str, Any], str], sep: str, limit: int = 8
) -> str:
    """The arguments in any order, `sep` between: the required ones once each, runs of up to
    `optional_runs` optional ones before, between and after them (llama.cpp's Kimi K3 and
    Muse grammars: `zero_or_more` of any argument; ours keeps each required one exactly
    once). One rule per set of required ones left; past `limit` of them they keep the
    schema's order."""
    props = params.get("properties") or {}
    required = [k for k in props if k in (params.get("required") or [])]
    req = [member(k, props[k]) for k in required]
    opt = [member(k, props[k]) for k in props if k not in required]
    s = f"{sep} " if sep else ""
    if not req:
        return members(g, params, member, sep)
    runs = ""
    lead = ""
    if opt:
        anyone, most = g.rule(" | ".join(opt)), optional_runs(len(opt))
        runs, lead = f"({s}{anyone}){{0,{most}}} ", f"({anyone} {s}){{0,{most}}} "
    if len(req) > limit:
        return lead + f" {runs}{s}".join(req) + f" {runs}".rstrip()
    memo: dict[int, str] = {}

    def left(mask: int) -> str:  # one of the required ones left, then what follows it
        if mask not in memo:
            alts = []
            for i, x in enumerate(req):
                rest = mask & ~(1 << i)
                if mask & (1 << i):
                    alts.append(f"{x} {runs}{s}{left(rest)}" if rest else f"{x} {runs}")
            memo[mask] = g.rule(" | ".join(a.strip() for a in alts))
        return memo[mask]

    return f"{lead}{left((1 << len(req)) - 1)}".strip()


def permuted(g: Lark, items: list[str], sep: str, limit: int = 6) -> str:
    """Each of `items` exactly once in any order, `sep` before each (llama.cpp's `permute`,
    up to `limit` items; past it they keep their order); one rule per set left."""
    if len(items) > limit:
        return " ".join(f"{sep} {x}" for x in items)
    memo: dict[int, str] = {}

    def left(mask: int) -> str:
        if not mask:
            return ""
        if mask not in memo:
            alts = [f"{sep} {x} {left(mask & ~(1 << i))}" for i, x in enumerate(items)
                    if mask & (1 << i)]  # fmt: skip
            memo[mask] = g.rule(" | ".join(alts))
        return memo[mask]

    return left((1 << len(items)) - 1)
