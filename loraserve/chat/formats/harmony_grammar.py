"""gpt-oss's tool-call grammars (llguidance Lark text), after llama.cpp's gpt-oss parser
(`common/parsers/gpt-oss.cpp`). The generation prompt ends in `<|start|>assistant`; an
answer is a sequence of messages, each `<|start|>assistant` after the first, and a call is
a message whose recipient, ` to=functions.NAME`, sits in the role header or the channel's:

    to=functions.NAME<|channel|>commentary json<|message|>ARGS
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS

- `required` / a named function: the call, after at most one analysis message (llama.cpp's
  grammar lets reasoning come first; the reasoning budget ends it), or after the analysis
  message the prompt opened; no other message before it.
- `auto`: lazy, as llama.cpp's pattern triggers make it. Messages with no recipient
  (analysis, a commentary preamble, the final answer) are free; a header that names
  ` to=functions` (llama.cpp's triggers: ` to` in the role header or
  `<|channel|>commentary to=functions` in the channel's) is a call of one of the tools, its
  arguments held to the tool's schema. Header text outside a call never spells
  `to=functions`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.special.lark import STYLE, Lark, closed

HEADER_TEXT = r"/[^<\n]*/ & ~/(.|\n)*to=functions(.|\n)*/"  # never a recipient


def harmony_grammar(
    fmt: ChatFormat,
    tools: list[dict[str, Any]],
    choice: str,
    thinking_open: bool,
    special: Callable[[str], bool],
) -> str:
    """Lark text for gpt-oss answers with `tools` under `choice` ("auto", "required" or a
    function's name, `tools` already narrowed to it); `thinking_open`: the prompt opened an
    analysis message the answer continues."""
    g = Lark(special)
    start, end, msg = g.q("<|start|>"), g.q("<|end|>"), g.q("<|message|>")
    channel = g.rule(f'{g.q("<|channel|>")} ("commentary" | "analysis")')
    constrain = f'(" " ({g.q("<|constrain|>")})? "json")?'
    calls = []
    for t in tools:
        fn = t["function"]
        params = closed(fn.get("parameters") or {"type": "object"})
        args = "%json " + json.dumps({"x-guidance": STYLE, **params})
        to = json.dumps(" to=functions." + fn["name"])
        heads = f"({to} {channel} | {channel} {to})"
        calls.append(g.rule(f"{heads} {constrain} {msg} {args}"))
    call = g.rule(" | ".join(calls))
    next_msg = f'{start} "assistant"'
    # a message's text and its end: a special <|end|> ends free text by itself; spelled as
    # text (a vocabulary without harmony's tokens) the text stops at its first <|end|>
    # (a lazy rule), and a last message without one never holds it
    ended = g.text_until("<|end|>")
    last = "TEXT" if end.startswith("<") else g.not_containing("<|end|>")
    if choice == "auto":
        name = '("commentary" | "analysis" | "final")'  # the call's own words, one lexeme
        parts = f"{g.q('<|channel|>')} {name} HEADER? | {g.q('<|constrain|>')} HEADER?"
        header = g.rule(f"HEADER? ({parts})+")
        body = g.rule("")  # a message, then (after its end) the next one
        plain = f"{header} {msg} ({ended} ({next_msg} {body})? | {last})"
        g.rules[int(body[1:]) - 1] = f"{body}: {call} | {plain}"
        head = f"{ended} {next_msg}" if thinking_open else ""
        return _lark(g, f"{head} {body}".strip())
    if thinking_open:
        return _lark(g, f"{ended} {next_msg} {call}")
    analysis = f'{g.q("<|channel|>")} "analysis" {msg}'
    return _lark(g, f"({analysis} {ended} {next_msg})? {call}")


def _lark(g: Lark, start: str) -> str:
    head = ["%llguidance {}", f"start: {start}", r"TEXT: /(.|\n)*/", f"HEADER: {HEADER_TEXT}"]
    return "\n".join(head + g.rules) + "\n"
