"""Gemma 4 answers (llama.cpp common/parsers/gemma4.cpp): reasoning in
`<|channel>thought ... <channel|>` blocks (any number, between content runs; stray
`<|channel>` tokens before one skipped), content up to an unmatched `<channel|>`, and calls
`<|tool_call>call:NAME{ARGS}<tool_call|>` whose arguments are Gemma's own notation: bare
keys, strings in `<|"|>` quotes, JSON numbers, booleans and null, converted to JSON as they
stream."""

from __future__ import annotations

import json

from loraserve.chat.formats.special.text import Need, Parsed, held, opt, skip_ws, until

TURN, CHANNEL, CHANNEL_END = "<|turn>model\n", "<|channel>", "<channel|>"
THOUGHT, CALL, CALL_END, QUOTE = "<|channel>thought", "<|tool_call>", "<tool_call|>", '<|"|>'


def parse(text: str, partial: bool, schemas: dict | None, extract: bool) -> Parsed:
    """The message in `text` (after the turn's `<|turn>model`)."""
    out = Parsed()
    try:
        _parse(text, partial, schemas is not None, extract, out)
    except Need:
        pass
    return out


def _parse(text: str, partial: bool, tools: bool, extract: bool, out: Parsed) -> None:
    i = len(TURN) if text.startswith(TURN) else 0
    if partial and TURN.startswith(text) and text:
        raise Need
    stops = (CHANNEL, CHANNEL_END, CALL) if tools else (CHANNEL, CHANNEL_END)
    while i < len(text):
        if text.startswith(CHANNEL, i) or CHANNEL.startswith(text[i:]):
            j = i
            while text.startswith(CHANNEL, j) and not THOUGHT.startswith(text[j : j + 17]):
                j += len(CHANNEL)
            if not text.startswith(THOUGHT, j):
                if partial and THOUGHT.startswith(text[j:]):
                    raise Need
                break
            k = skip_ws(text, j + len(THOUGHT))
            body, end, _ = until(text, k, (CHANNEL_END,), partial)
            if extract:
                out.reasoning += body
            else:
                out.content += text[j:k] + body + (CHANNEL_END if end >= 0 else "")
            if end < 0:
                return
            i = end + len(CHANNEL_END)
            continue
        if text.startswith(CHANNEL_END, i) or (tools and text.startswith(CALL, i)):
            break
        body, end, _ = until(text, i, stops, partial)
        out.content += body
        if end < 0:
            return
        i = end
    if not tools:
        return
    i = text.find(CALL, i)
    while i >= 0:
        i = _call(text, i + len(CALL), out)
        i = skip_ws(text, i)
        if not text.startswith(CALL, i):
            if partial and i < len(text) and CALL.startswith(text[i:]):
                raise Need
            return


def _call(text: str, i: int, out: Parsed) -> int:
    """One call after `<|tool_call>`; the position after its `<tool_call|>`."""
    if not text.startswith("call:", i):
        if "call:".startswith(text[i:]):
            raise Need
        return len(text)
    k = text.find("{", i)
    if k < 0:
        raise Need
    call = out.call(text[i + 5 : k].strip())
    end = _value(text, k, call)
    return opt(text, skip_ws(text, end), CALL_END)


def _value(text: str, i: int, call: list[str]) -> int:
    """Appends the JSON of the Gemma value at `i` to the call's arguments; its end."""
    i = skip_ws(text, i)
    if i >= len(text):
        raise Need
    c = text[i]
    if text.startswith(QUOTE, i):
        k = text.find(QUOTE, i + len(QUOTE))
        raw = text[i + len(QUOTE) : k if k >= 0 else len(text)]
        if k < 0:
            raw = raw[: len(raw) - held(raw, (QUOTE,))]
        call[1] += json.dumps(raw, ensure_ascii=False)[: None if k >= 0 else -1]
        if k < 0:
            raise Need
        return k + len(QUOTE)
    if c in "{[":
        close = "}" if c == "{" else "]"
        call[1] += c
        i = skip_ws(text, i + 1)
        first = True
        while True:
            if i >= len(text):
                raise Need
            if text[i] == close:
                call[1] += close
                return i + 1
            if not first:
                if text[i] != ",":
                    raise _Bad
                call[1] += ","
                i = skip_ws(text, i + 1)
            first = False
            if c == "{":
                k = i
                while k < len(text) and text[k] not in ":}":
                    k += 1
                if k >= len(text):
                    call[1] += json.dumps(text[i:], ensure_ascii=False)[:-1]
                    raise Need
                call[1] += json.dumps(text[i:k], ensure_ascii=False) + ":"
                i = k + 1
            i = skip_ws(text, _value(text, i, call))
    k = i
    while k < len(text) and text[k] not in ",}]<" + " \n":
        k += 1
    if k >= len(text):
        call[1] += text[i:]
        raise Need
    call[1] += text[i:k]
    return k


class _Bad(Need):
    """Not Gemma's notation: the call ends here (its arguments are not JSON)."""
