"""Cohere2 MoE answers (llama.cpp common/parsers/cohere2moe.cpp): a thinking block the
generation prompt opens (`<|START_THINKING|>` .. `<|END_THINKING|>`, cut short by the text or
the action), then either the text (`<|START_TEXT|>` .. `<|END_TEXT|>`) or the calls
(`<|START_ACTION|>[{"tool_call_id": .., "tool_name": .., "parameters": {..}}, ..]
<|END_ACTION|>`), never both. With reasoning not extracted the thinking block stays in the
content, markers included."""

from __future__ import annotations

import json

from loraserve.chat.formats.scan import Incomplete, loads, object_members
from loraserve.chat.formats.special.text import Invalid, Need, Parsed, at, lit, skip_ws, until

THINK, THINK_END = "<|START_THINKING|>", "<|END_THINKING|>"
TEXT, TEXT_END = "<|START_TEXT|>", "<|END_TEXT|>"
ACTION, ACTION_END = "<|START_ACTION|>", "<|END_ACTION|>"
TURN_END = "<|END_OF_TURN_TOKEN|>"


def parse(text: str, partial: bool, schemas: dict | None, extract: bool) -> Parsed:
    """The message in `text` (after the turn's `<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>`)."""
    out = Parsed()
    try:
        i = 0
        if at(text, 0, THINK):
            body, k, stop = until(text, len(THINK), (THINK_END, TEXT, ACTION), partial)
            if extract:
                out.reasoning = body
            else:
                out.content = THINK + body + (THINK_END if stop == THINK_END else "")
            if k < 0:
                return out
            i = k + len(THINK_END) if stop == THINK_END else k
        i = skip_ws(text, i)
        if schemas is not None and at(text, i, ACTION):
            _calls(text, i + len(ACTION), out)
        elif at(text, i, TEXT):
            out.content += until(text, i + len(TEXT), (TEXT_END, TURN_END), partial)[0]
        else:
            out.content += until(text, i, (TEXT_END, TURN_END), partial)[0]
    except (Need, Invalid, Incomplete):
        pass
    return out


def _calls(text: str, i: int, out: Parsed) -> None:
    i = skip_ws(text, lit(text, i, "["))
    while not at(text, i, "]"):
        if out.calls:
            if not at(text, i, ","):
                raise Invalid
            i = skip_ws(text, i + 1)
        members, end = object_members(text, i)
        found = {key: (s, e) for key, s, e in members}
        name, args, id_ = found.get("tool_name"), found.get("parameters"), found.get("tool_call_id")
        if name is None or name[1] is None:
            raise Need
        call = out.call(str(loads(text[name[0] : name[1]])))
        if id_ is not None and id_[1] is not None:
            value = loads(text[id_[0] : id_[1]])
            call[2] = value if isinstance(value, str) else json.dumps(value)
        if args is not None:
            call[1] = text[args[0] : len(text) if args[1] is None else args[1]]
        if end is None:
            raise Need
        i = skip_ws(text, end)
