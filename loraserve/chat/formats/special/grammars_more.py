"""`required` grammars of MiniMax-M3 (namespaced XML expanded by the schema), LFM2 (Python
calls), Muse Glimmer (atem:invoke messages) and Functionary v3.2 (`NAME\\n{json}` after the
prompt's `>>>`). MiniMax-M3's and LFM2's return (the reasoning the answer may start with,
the calls after their trigger); Muse's and Functionary's, whose calls no word starts, the
whole answer; their `auto` grammars (`muse_auto`, `functionary_auto`) leave the messages with
no function recipient free, as llama.cpp's pattern triggers do."""

from __future__ import annotations

import json
from typing import Any

from loraserve.chat.formats.special import lfm2, minimax_m3, muse
from loraserve.chat.formats.special.functionary import ALL, SEP
from loraserve.chat.formats.special.lark import (
    NUMBER,
    Lark,
    any_order,
    closed,
    integer,
    json_value,
    members,
)
from loraserve.chat.formats.special.text import may_be_string, types_of


def _members(g: Lark, schema: dict[str, Any], member: Any) -> str:
    """llama.cpp's `members_of`: the required properties in the schema's order, then the
    optional ones in any order and number, `space` before each."""
    return f"WS {members(g, schema, member, 'WS')}" if schema.get("properties") else ""


def _mm_value(g: Lark, schema: Any, close: str) -> str:
    schema = schema if isinstance(schema, dict) else {}
    ns = minimax_m3.NS
    if may_be_string(schema):
        return g.string_until(schema, close)
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if alternatives:
        return g.rule(" | ".join(_mm_value(g, a, close) for a in alternatives))
    if schema.get("type") == "object" and schema.get("properties"):

        def member(key: str, sub: Any) -> str:
            return g.rule(f"{g.q(f'{ns}<{key}>')} {_mm_value(g, sub, f'{ns}</{key}>')}")

        return g.rule(f"{_members(g, schema, member)} WS {g.q(close)}")
    if schema.get("type") == "array":
        item = _mm_value(g, schema.get("items"), f"{ns}</item>")
        return g.rule(f"(WS {g.q(ns + '<item>')} {item})* WS {g.q(close)}")
    return f"{json_value(schema)} {g.q(close)}"


def minimax_m3_body(
    g: Lark, tools: list[dict[str, Any]], parallel: bool, thinking_open: bool
) -> tuple[str, str]:
    """MiniMax-M3: `NS<tool_call>` `NS<invoke name="NAME">` `NS<KEY>V NS</KEY>`..
    `NS</invoke>` `NS</tool_call>`, after an optional `<mm:think>` block."""
    calls = []
    for t in tools:
        fn = t["function"]
        params = fn.get("parameters") or {}

        def member(key: str, sub: Any) -> str:
            ns = minimax_m3.NS
            return g.rule(f"{g.q(f'{ns}<{key}>')} {_mm_value(g, sub, f'{ns}</{key}>')}")

        args = _members(g, params, member)
        head = g.q(f'{minimax_m3.INVOKE}{fn["name"]}">')
        calls.append(g.rule(f"{head} {args} WS {g.q(minimax_m3.INVOKE_END)}"))
    call = g.rule(" | ".join(calls))
    more = f"(WS {call})*" if parallel else ""
    rest = g.reasoning_until(minimax_m3.THINK_END)
    block = f"{g.q(minimax_m3.THINK)} {rest}"
    think = f"({block} | {g.q(minimax_m3.THINK_END)})?"  # a turn without: a bare end
    if thinking_open:  # a reasoning prefill opened the block: its rest, then the end
        think = rest
    return think, f"WS {call} {more} WS {g.q(minimax_m3.END)}"


def _py_string(schema: dict[str, Any]) -> str:
    """A quoted Python or JSON string as the schema bounds it: one of its `enum` strings,
    else up to `maxLength` characters (an escape counted as one), else any."""
    enum = schema.get("enum")
    if enum and all(isinstance(v, str) for v in enum):
        quoted = [json.dumps(json.dumps(v, ensure_ascii=False)) for v in enum]
        quoted += [json.dumps(f"'{v}'") for v in enum if "'" not in v and "\\" not in v]
        return " | ".join(quoted)
    top = schema.get("maxLength")
    low = schema.get("minLength", 0)
    reps = f"{{{low if isinstance(low, int) else 0},{top}}}" if isinstance(top, int) else "*"
    return rf'/"([^"\\\n]|\\.){reps}"/ | /' + rf"'([^'\\\n]|\\.){reps}'/"


def _py_value(g: Lark, schema: Any) -> str:
    schema = schema if isinstance(schema, dict) else {}
    kinds = types_of(schema) or {"string", "number", "boolean", "null", "array", "object"}
    options = []
    if "string" in kinds:
        options.append(_py_string(schema))
    if "integer" in kinds:
        options.append(integer(schema))
    if "number" in kinds:
        options.append(NUMBER)
    if "boolean" in kinds:
        options.append('"True" | "False" | "true" | "false"')
    if "null" in kinds:
        options.append('"None" | "null"')
    if "array" in kinds:
        item = _py_value(g, schema.get("items")) if schema.get("items") else "d0"
        options.append(f'"[" WS ({item} ("," WS {item})*)? WS "]"')
    if "object" in kinds:
        options.append('"{" WS (d00 WS ":" WS d0 ("," WS d00 WS ":" WS d0)*)? WS "}"')
    return g.rule(" | ".join(options))


def lfm2_body(
    g: Lark, tools: list[dict[str, Any]], parallel: bool, thinking_open: bool
) -> tuple[str, str]:
    """LFM2: `<|tool_call_start|>[NAME(KEY=VALUE, ..), ..]<|tool_call_end|>`, Python or
    JSON literals as the parser reads them; after the rest of a `<think>` block a reasoning
    prefill opened (llama.cpp's continuation: `<think>` + the prefill)."""
    g.rules.append(f"d0: {_py_value(g, {})}")  # any value
    g.rules.append(r'd00: /"([^"\\\n]|\\.)*"/')  # a dict's key
    calls = []
    for t in tools:
        fn = t["function"]
        params = fn.get("parameters") or {}

        def member(key: str, sub: Any) -> str:
            return g.rule(f'"{key}=" {_py_value(g, sub)}')

        # llama.cpp's: any argument, then more after `,` `space`, `space` inside the
        # parentheses (ours: the required ones once each, in any order)
        args = any_order(g, params, member, '"," WS') if params.get("properties") else ""
        calls.append(g.rule(f'"{fn["name"]}(" WS {args} WS ")"'.replace("  ", " ")))
    call = g.rule(" | ".join(calls))
    more = f'("," WS {call})*' if parallel else ""
    rest = g.reasoning_until(lfm2.THINK_END)
    think = rest if thinking_open else f"({g.q(lfm2.THINK)} {rest})?"
    return think, f'"[" {call} {more} "]" {g.q(lfm2.END)}'


def _muse_text(g: Lark) -> str:
    """A Muse message's text up to and past its `<|eom|>`, then the next message's start."""
    if g.q(muse.EOM).startswith('"'):  # markers spelled as text: up to the first <|eom|>
        return f"{g.text_until(muse.EOM)} {g.q(muse.START)}"
    inner = [q for q in map(g.q, muse.BODY_TOKENS) if not q.startswith('"')]  # as tokens
    text = g.rule(f"TEXT (({' | '.join(inner)}) TEXT)*") if inner else "TEXT"
    return f"{text} {g.q(muse.EOM)} {g.q(muse.START)}"


def muse_body(
    g: Lark, tools: list[dict[str, Any]], parallel: bool, thinking_open: bool,
    new_block: bool = False,
) -> str:  # fmt: skip
    """Muse Glimmer: ` to=NAME<|message|><atem:function_calls><atem:invoke name="NAME">
    <atem:parameter name="K">V</atem:parameter>..</atem:invoke></atem:function_calls>`;
    more calls as `<|eom|>` messages. `thinking_open`: a reasoning prefill left the answer
    inside a ` to=self` message (llama.cpp's continuation), which ends first; `new_block`:
    one ` to=self` reasoning message the answer writes itself may come first."""
    calls = []
    for t in tools:
        fn = t["function"]

        def member(key: str, sub: Any) -> str:
            head = g.q(f'{muse.PARAM}{key}">')
            if may_be_string(sub):
                return g.rule(f"{head} {g.string_until(sub, muse.PARAM_END)}")
            return g.rule(f"{head} {json_value(sub)} {g.q(muse.PARAM_END)}")

        # llama.cpp's: `zero_or_more` of any argument (ours: the required ones once each)
        args = any_order(g, closed(fn.get("parameters") or {}), member, "WS")
        head = f"{json.dumps(' to=' + fn['name'])} {g.q(muse.MESSAGE)} {g.q(muse.CALLS)} WS"
        invoke = g.q(f'{muse.INVOKE}{fn["name"]}">')
        end = f"WS {g.q(muse.INVOKE_END)} WS {g.q(muse.CALLS_END)}"
        calls.append(g.rule(f"{head} {invoke} WS {args} {end}"))
    call = g.rule(" | ".join(calls))
    nxt = f"{g.q(muse.EOM)} {g.q(muse.START)}"
    more = f"({nxt} {call})*" if parallel else ""
    head = f"{_muse_text(g)} " if thinking_open else ""
    if new_block and not thinking_open:
        head = f'(" to=self" {g.q(muse.MESSAGE)} {_muse_text(g)})? '
    return f"{head}{call} {more}"


def muse_auto(g: Lark, tools: list[dict[str, Any]], parallel: bool, thinking_open: bool) -> str:
    """Muse Glimmer under `auto`: reasoning messages (` to=self`) and the answer (` to=user`
    or no recipient) free, a message to any other recipient one of the tools' calls
    (llama.cpp's trigger: ` to=` other than self or user), calls after the answer too."""
    calls = g.rule(muse_body(g, tools, parallel, False))
    nxt = f"{g.q(muse.EOM)} {g.q(muse.START)}"
    message = g.q(muse.MESSAGE)
    body = g.rule("")  # a message, then the next one
    if g.q(muse.EOM).startswith('"'):  # markers spelled as text: a message's text stops at
        ended = g.text_until(muse.EOM)  # its first <|eom|> (a lazy rule)
        analysis = f'" to=self" {message} {ended} {g.q(muse.START)} {body}'
        last = f"({g.text_until(muse.EOT)} | {g.not_containing(muse.EOM)})"
        final = f'(" to=user")? {message} ({ended} {g.q(muse.START)} {calls} | {last})'
        g.rules[int(body[1:]) - 1] = f"{body}: {calls} | {analysis} | {final}"
        unended = g.not_containing(muse.EOM)
    else:
        inner = [q for q in map(g.q, muse.BODY_TOKENS) if not q.startswith('"')]  # as tokens
        text = g.rule(f"TEXT (({' | '.join(inner)}) TEXT)*") if inner else "TEXT"
        analysis = f'" to=self" {message} {text} {nxt} {body}'
        final = f'(" to=user")? {message} {text} ({nxt} {calls} | {g.q(muse.EOT)})?'
        g.rules[int(body[1:]) - 1] = f"{body}: {calls} | {analysis} | {final}"
        unended = text
    if thinking_open:  # the open ` to=self` message ends, then the messages as above
        return g.rule(f"{_muse_text(g)} {body} | {unended}")
    return body


def functionary_body(
    g: Lark, tools: list[dict[str, Any]], parallel: bool, _open: bool, _new: bool = False
) -> str:
    """Functionary v3.2: `NAME\\n{arguments}` (the prompt wrote `>>>`), more as `>>>NAME..`."""
    calls = []
    for t in tools:
        fn = t["function"]
        schema = closed(fn.get("parameters") or {"type": "object"})
        calls.append(g.rule(f"{json.dumps(fn['name'] + chr(10))} {json_value(schema)}"))
    call = g.rule(" | ".join(calls))
    return f'{call} (">>>" {call})*' if parallel else call


def functionary_auto(g: Lark, tools: list[dict[str, Any]], parallel: bool, _open: bool) -> str:
    """Functionary v3.2 under `auto`: `all\\n` messages free (text up to the next `>>>`),
    any other recipient one of the tools' calls (llama.cpp's trigger: `>>>(?!all)`)."""
    calls = g.rule(functionary_body(g, tools, parallel, False))
    body = g.rule("")
    more = g.rule(f"TEXT {json.dumps(SEP)}", lazy=True)  # the text up to the first `>>>`
    free = f"{json.dumps(ALL)} ({more} {body} | {g.not_containing(SEP)})"
    g.rules[int(body[1:]) - 1] = f"{body}: {calls} | {free}"
    return body
