"""Ling 3.0 answers (llama.cpp common/parsers/ling3.cpp): the generation prompt opens
`<think>`, so reasoning runs to `</think>` or to a call's `<tool_call>`; content; calls
`<tool_call>NAME <arg_key>K</arg_key> <arg_value>V</arg_value> ... </tool_call>` (whitespace
between the tags optional) with content after them; a trailing `<|role_end|>` is dropped.
A value is raw text where the schema allows only strings, JSON where it allows no string,
and JSON falling back to the raw text otherwise."""

from __future__ import annotations

from loraserve.chat.formats.special.text import (
    Args,
    Invalid,
    Need,
    Parsed,
    args_end,
    at,
    json_or,
    lit,
    name_until,
    properties,
    raw_arg,
    read_reasoning,
    skip_ws,
    types_of,
    until,
)

THINK, THINK_END, ROLE_END = "<think>", "</think>", "<|role_end|>"
CALL, CALL_END = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


def parse(text: str, partial: bool, schemas: dict | None, extract: bool) -> Parsed:
    """The message in `text` (after the turn's `<role>ASSISTANT</role>`)."""
    out = Parsed()
    tools = schemas is not None
    try:
        i = skip_ws(text, 0)
        if at(text, i, THINK):
            cut = (CALL,) if tools else ()
            i = read_reasoning(text, i + len(THINK), THINK_END, cut, partial, out, extract)
            if i < 0:
                return out
        stops = (CALL, ROLE_END) if tools else (ROLE_END,)
        body, k, stop = until(text, i, stops, partial)
        out.content += body
        if stop == CALL:
            i = _calls(text, k, schemas or {}, out)
            out.content += until(text, skip_ws(text, i), (ROLE_END,), partial)[0]
    except (Need, Invalid):
        pass
    return out


def _calls(text: str, i: int, schemas: dict, out: Parsed) -> int:
    while True:
        j = skip_ws(text, i)
        if not at(text, j, CALL):
            return j
        j += len(CALL)
        _, k, _ = until(text, j, ("\n", KEY, CALL_END), False)
        if k < 0:
            raise Need
        name = text[j:k].strip()
        args = Args(out.call(name))
        props = properties(schemas, name)
        i = k
        while True:
            i, closed = args_end(text, i, args, CALL_END)
            if closed:
                break
            key, i = name_until(text, lit(text, i, KEY), KEY_END)
            i = lit(text, i, VALUE)
            args.key(key)
            kinds = types_of(props.get(key))
            if kinds == {"string"}:
                i = raw_arg(text, i, VALUE_END, args, None)
            else:
                loose = "string" in kinds or not kinds
                i = raw_arg(text, i, VALUE_END, args, _json_loose if loose else _json_strict)


def _json_loose(raw: str) -> str:
    return json_or(raw, raw)


def _json_strict(raw: str) -> str:
    return json_or(raw, None)
