"""MiniMax-M3 answers (llama.cpp common/parsers/minimax-m3.cpp): `<mm:think>` reasoning (or a
bare `</mm:think>` for a turn without), content, then calls whose every tag carries the
namespace token `]<]minimax[>[`: `NS<tool_call>` `NS<invoke name="NAME">` one element per
argument `NS<KEY>VALUE NS</KEY>` `NS</invoke>` `NS</tool_call>`. A value is read by the
tool's schema, as the template expands it: raw text where a string is allowed, nested
elements for an object with properties, `NS<item>` elements for an array, else JSON."""

from __future__ import annotations

import json
from typing import Any

from loraserve.chat.formats.special.text import (
    Invalid,
    Need,
    Parsed,
    args_end,
    at,
    content_before,
    json_or,
    lit,
    may_be_string,
    name_until,
    next_invoke,
    properties,
    raw_arg,
    read_reasoning,
    skip_ws,
    until,
)

NS = "]<]minimax[>["
THINK, THINK_END = "<mm:think>", "</mm:think>"
START, END = NS + "<tool_call>", NS + "</tool_call>"
INVOKE, INVOKE_END = NS + '<invoke name="', NS + "</invoke>"


def parse(text: str, partial: bool, schemas: dict | None, extract: bool) -> Parsed:
    """The message in `text` (after the turn's `]~b]ai`)."""
    out = Parsed()
    try:
        i = skip_ws(text, 0)
        if extract and at(text, i, THINK):
            i = read_reasoning(text, i + len(THINK), THINK_END, (), partial, out, True)
            if i < 0:
                return out
        elif extract and at(text, i, THINK_END):
            i += len(THINK_END)
        k = content_before(text, i, None if schemas is None else START, partial, out)
        if schemas is not None and k >= 0:
            _calls(text, k, schemas, out)
    except (Need, Invalid):
        pass
    return out


def _calls(text: str, i: int, schemas: dict, out: Parsed) -> None:
    while True:
        args, i = next_invoke(text, i, END, INVOKE, out)
        if args is None:
            return
        props = properties(schemas, args.call[0])
        while True:
            i, closed = args_end(text, i, args, INVOKE_END)
            if closed:
                break
            key, i = name_until(text, lit(text, i, NS + "<"), ">")
            close = f"{NS}</{key}>"
            args.key(key)
            if may_be_string(props.get(key)):
                i = raw_arg(text, i, close, args, None)
            else:
                value, i = _value(text, i, props.get(key), close)
                args.value(value)


def _value(text: str, i: int, schema: Any, close: str) -> tuple[str, int]:
    """The value at `i` up to and past `close`, as JSON text."""
    schema = schema if isinstance(schema, dict) else {}
    if may_be_string(schema):
        raw, k, _ = until(text, i, (close,), True)
        if k < 0:
            raise Need
        return json.dumps(raw, ensure_ascii=False), k + len(close)
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if alternatives:
        for alt in alternatives:
            try:
                return _value(text, i, alt, close)
            except Invalid:
                continue
        raise Invalid
    kind = schema.get("type")
    if kind == "object" and schema.get("properties"):
        parts = []
        while True:
            j = skip_ws(text, i)
            if at(text, j, close):
                return "{" + ", ".join(parts) + "}", j + len(close)
            key, i = name_until(text, lit(text, j, NS + "<"), ">")
            value, i = _value(text, i, schema["properties"].get(key), f"{NS}</{key}>")
            parts.append(json.dumps(key, ensure_ascii=False) + ": " + value)
    if kind == "array":
        items = []
        while True:
            j = skip_ws(text, i)
            if at(text, j, close):
                return "[" + ", ".join(items) + "]", j + len(close)
            i = lit(text, j, NS + "<item>")
            value, i = _value(text, i, schema.get("items"), NS + "</item>")
            items.append(value)
    raw, k, _ = until(text, i, (close,), True)
    if k < 0:
        raise Need
    return json_or(raw, None), k + len(close)
