"""LFM2 / LFM2.5 answers (llama.cpp common/parsers/lfm2.cpp): optional `<think>` reasoning
(only where the template knows `<think>`), content, then
`<|tool_call_start|>[name(key=value, ...), ...]<|tool_call_end|>`: Python-style calls whose
values are Python or JSON literals (strings in either quotes, True/true, None/null, lists,
dicts), converted to JSON. An argument joins the streamed JSON once its value is whole."""

from __future__ import annotations

import json
from typing import Any

from loraserve.chat.formats.special.text import (
    Args,
    Invalid,
    Need,
    Parsed,
    at,
    content_before,
    lit,
    read_reasoning,
    skip_ws,
)

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
THINK, THINK_END = "<think>", "</think>"
_WORDS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def parse(text: str, partial: bool, schemas: dict | None, extract: bool, think: bool) -> Parsed:
    """The message in `text` (after the turn's `<|im_start|>assistant`); `think`: the
    template knows `<think>` (reasoning is read only then)."""
    out = Parsed()
    try:
        i = skip_ws(text, 0)
        if extract and think and at(text, i, THINK):
            i = read_reasoning(text, i + len(THINK), THINK_END, (), partial, out, True)
            if i < 0:
                return out
        k = content_before(text, i, None if schemas is None else START, partial, out)
        if schemas is not None and k >= 0:
            _calls(text, k, out)
    except (Need, Invalid):
        pass
    return out


def _calls(text: str, i: int, out: Parsed) -> None:
    i = lit(text, i, "[")
    while True:
        i = skip_ws(text, i)
        k = i
        while k < len(text) and (text[k].isalnum() or text[k] in "_.-"):
            k += 1
        if k >= len(text):
            raise Need
        if text[k] != "(" or k == i:
            raise Invalid
        args = Args(out.call(text[i:k]))
        i = skip_ws(text, k + 1)
        while not at(text, i, ")"):
            if args.n:
                if not at(text, i, ","):
                    raise Invalid
                i = skip_ws(text, i + 1)
            e = text.find("=", i)
            if e < 0:
                raise Need
            key = text[i:e].strip()
            if not key.isidentifier():
                raise Invalid
            args.key(key)
            value, i = _value(text, skip_ws(text, e + 1))
            args.value(json.dumps(value, ensure_ascii=False))
            i = skip_ws(text, i)
        args.close()
        i = skip_ws(text, i + 1)
        if at(text, i, "]"):
            return
        if not at(text, i, ","):
            raise Invalid
        i += 1


def _value(text: str, i: int) -> tuple[Any, int]:
    """The Python/JSON literal at `i`: (its value, its end)."""
    if i >= len(text):
        raise Need
    c = text[i]
    if c in "\"'":
        return _string(text, i)
    if c in "[{":
        close = "]" if c == "[" else "}"
        items: list[Any] = []
        pairs: dict[str, Any] = {}
        i = skip_ws(text, i + 1)
        while not at(text, i, close):
            if items or pairs:
                if not at(text, i, ","):
                    raise Invalid
                i = skip_ws(text, i + 1)
                if at(text, i, close):  # a trailing comma
                    break
            value, i = _value(text, i)
            if c == "{":
                i = skip_ws(text, i)
                if not at(text, i, ":"):
                    raise Invalid
                pairs[str(value)], i = _value(text, skip_ws(text, i + 1))
            else:
                items.append(value)
            i = skip_ws(text, i)
        return (pairs if c == "{" else items), i + 1
    k = i
    while k < len(text) and (text[k].isalnum() or text[k] in "+-._"):
        k += 1
    if k >= len(text):
        raise Need
    word = text[i:k]
    if word in _WORDS:
        return _WORDS[word], k
    try:
        return json.loads(word), k
    except ValueError:
        raise Invalid from None


def _string(text: str, i: int) -> tuple[str, int]:
    q, k, chars = text[i], i + 1, []
    escapes = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "0": "\0"}
    while k < len(text):
        ch = text[k]
        if ch == "\\":
            if k + 1 >= len(text):
                raise Need
            nxt = text[k + 1]
            if nxt == "u":
                code = text[k + 2 : k + 6]
                if len(code) < 4:
                    raise Need
                try:
                    chars.append(chr(int(code, 16)))
                except ValueError:
                    raise Invalid from None
                k += 6
                continue
            chars.append(escapes.get(nxt, nxt))
            k += 2
            continue
        if ch == q:
            return "".join(chars), k + 1
        chars.append(ch)
        k += 1
    raise Need
