"""Muse Glimmer answers (llama.cpp common/parsers/muse-glimmer.cpp): messages
`<|start|>assistant to=RECIPIENT<|message|>BODY` ended by `<|eom|>` (more follow) or
`<|eot|>`. To `self`: reasoning; to `user` (or none): content; to anything else: a call,
BODY being `<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="K">V
</atem:parameter>..</atem:invoke></atem:function_calls>` (V raw where the schema allows a
string, else JSON)."""

from __future__ import annotations

from loraserve.chat.formats.special.text import (
    Args,
    Invalid,
    Need,
    Parsed,
    args_end,
    json_value,
    lit,
    may_be_string,
    name_until,
    properties,
    raw_arg,
    skip_ws,
    until,
)

START, MESSAGE, EOM, EOT = "<|start|>assistant", "<|message|>", "<|eom|>", "<|eot|>"
CALLS, CALLS_END = "<atem:function_calls>", "</atem:function_calls>"
INVOKE, INVOKE_END = '<atem:invoke name="', "</atem:invoke>"
PARAM, PARAM_END = '<atem:parameter name="', "</atem:parameter>"
BODY_TOKENS = (CALLS, CALLS_END, INVOKE_END, PARAM_END)  # special tokens text may quote


def parse(text: str, partial: bool, schemas: dict | None, extract: bool) -> Parsed:
    """The message in `text` (after the turn's `<|start|>assistant`)."""
    out = Parsed()
    if not extract and schemas is None:
        out.content = until(text, 0, (), partial)[0]
        return out
    try:
        i = 0
        while True:
            to, i = name_until(text, i, MESSAGE)
            to = to.removeprefix("to=").strip()
            if to in ("self", "user", ""):
                body, k, stop = until(text, i, (EOM, EOT), partial)
                if to == "self" and extract:
                    out.reasoning += body
                else:
                    out.content += body
                if k < 0 or stop == EOT:
                    return out
                i = k + len(EOM)
            elif schemas is not None:
                i = _call(text, i, schemas, out)
                i = lit(text, skip_ws(text, i), EOM)
            else:
                return out
            i = lit(text, i, START, ws=False)
    except (Need, Invalid):
        pass
    return out


def _call(text: str, i: int, schemas: dict, out: Parsed) -> int:
    name, i = name_until(text, lit(text, lit(text, i, CALLS, ws=False), INVOKE), '">')
    args = Args(out.call(name))
    props = properties(schemas, name)
    while True:
        j, closed = args_end(text, i, args, INVOKE_END)
        if closed:
            return lit(text, j, CALLS_END)
        key, i = name_until(text, lit(text, j, PARAM), '">')
        args.key(key)
        if may_be_string(props.get(key)):
            i = raw_arg(text, i, PARAM_END, args, None)
        else:
            value, i = json_value(text, i)
            args.value(value)
            i = lit(text, i, PARAM_END)
