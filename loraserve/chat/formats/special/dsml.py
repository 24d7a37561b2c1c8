"""DeepSeek V3.2 / V4 answers (llama.cpp common/parsers/deepseek.cpp, the DSML markup):
`<think>` reasoning closed by `</think>` or cut short by the calls, content, then
`<｜DSML｜function_calls>` (V4: `tool_calls`) holding `<｜DSML｜invoke name="NAME">` calls
whose arguments are `<｜DSML｜parameter name="K" string="true|false">VALUE</｜DSML｜parameter>`:
a raw string when `string="true"`, else a JSON value."""

from __future__ import annotations

from loraserve.chat.formats.special.text import (
    Invalid,
    Need,
    Parsed,
    args_end,
    at,
    content_before,
    json_or,
    lit,
    name_until,
    next_invoke,
    raw_arg,
    read_reasoning,
)

DSML = "｜DSML｜"
THINK, THINK_END = "<think>", "</think>"
INVOKE, INVOKE_END = f'<{DSML}invoke name="', f"</{DSML}invoke>"
PARAM, PARAM_END = f'<{DSML}parameter name="', f"</{DSML}parameter>"


def block(v4: bool) -> tuple[str, str]:
    """The calls block's start and end markers."""
    name = "tool_calls" if v4 else "function_calls"
    return f"<{DSML}{name}>", f"</{DSML}{name}>"


def parse(text: str, partial: bool, schemas: dict | None, extract: bool, v4: bool) -> Parsed:
    """The message in `text` (after the turn's `<｜Assistant｜>`)."""
    out = Parsed()
    start, end = block(v4)
    tools = schemas is not None
    try:
        i = 0
        if extract and at(text, 0, THINK):
            cut = (start,) if tools else ()
            i = read_reasoning(text, len(THINK), THINK_END, cut, partial, out, True)
            if i < 0:
                return out
        elif extract and at(text, 0, THINK_END):
            i = len(THINK_END)
        k = content_before(text, i, start if tools else None, partial, out)
        if k >= 0:
            _calls(text, k, end, out)
    except (Need, Invalid):
        pass
    return out


def _calls(text: str, i: int, end: str, out: Parsed) -> None:
    while True:
        args, i = next_invoke(text, i, end, INVOKE, out)
        if args is None:
            return
        while True:
            i, closed = args_end(text, i, args, INVOKE_END)
            if closed:
                break
            key, i = name_until(text, lit(text, i, PARAM), '"')
            i = lit(text, i, ' string="', ws=False)
            kind, i = name_until(text, i, '">')
            args.key(key)
            i = raw_arg(text, i, PARAM_END, args, None if kind == "true" else _json)


def _json(raw: str) -> str:
    return json_or(raw, raw.strip())
