"""Kimi K3 answers (llama.cpp common/parsers/kimi-k3.cpp): `<|open|>NAME<|sep|>` ...
`<|close|>NAME<|sep|>` sections: reasoning in `think` (which the generation prompt opens;
it ends at its close or where the response starts), content in `response`, calls in `tools`
as `<|open|>call tool="NAME" ...<|sep|>` holding `<|open|>argument key="K" ...<|sep|>V
<|close|>argument<|sep|>` elements: raw text for a string parameter (or one of no type),
else the value as JSON."""

from __future__ import annotations

from loraserve.chat.formats.special.text import (
    Args,
    Invalid,
    Need,
    Parsed,
    at,
    json_or,
    lit,
    name_until,
    opt,
    properties,
    raw_arg,
    read_reasoning,
    until,
)

SEP = "<|sep|>"
MSG = '<|open|>message role="assistant"<|sep|>'
THINK, THINK_END = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
RESP, RESP_END, MSG_END = (
    "<|open|>response<|sep|>",
    "<|close|>response<|sep|>",
    "<|close|>message<|sep|>",
)
TOOLS, TOOLS_END = "<|open|>tools<|sep|>", "<|close|>tools<|sep|>"
CALL, CALL_END = '<|open|>call tool="', "<|close|>call<|sep|>"
ARG, ARG_END = '<|open|>argument key="', "<|close|>argument<|sep|>"


def parse(text: str, partial: bool, schemas: dict | None, extract: bool) -> Parsed:
    """The message in `text` (after the turn's `<|open|>message role="assistant"<|sep|>`)."""
    out = Parsed()
    try:
        i = opt(text, 0, THINK, ws=False)
        i = read_reasoning(text, i, THINK_END, (RESP,), partial, out, extract)
        if i < 0:
            return out
        i = opt(text, i, RESP, ws=False)
        stops = (RESP_END, TOOLS, MSG_END) if schemas is not None else (RESP_END, MSG_END)
        body, k, stop = until(text, i, stops, partial)
        out.content += body
        if k < 0:
            return out
        i = opt(text, k, RESP_END, ws=False)
        if schemas is not None and at(text, i, TOOLS):
            _calls(text, i + len(TOOLS), schemas, out)
    except (Need, Invalid):
        pass
    return out


def _calls(text: str, i: int, schemas: dict, out: Parsed) -> None:
    while not at(text, i, TOOLS_END):
        name, i = name_until(text, lit(text, i, CALL, ws=False), '"')
        _, i = name_until(text, i, SEP)
        args = Args(out.call(name))
        props = properties(schemas, name)
        while not at(text, i, CALL_END):
            key, i = name_until(text, lit(text, i, ARG, ws=False), '"')
            _, i = name_until(text, i, SEP)
            args.key(key)
            schema = props.get(key)
            kind = schema.get("type") if isinstance(schema, dict) else None
            raw_string = not isinstance(kind, str) or kind == "string"
            i = raw_arg(text, i, ARG_END, args, None if raw_string else _json)
        args.close()
        i += len(CALL_END)


def _json(raw: str) -> str:
    return json_or(raw, raw)
