"""The grammars of the dialect formats under `tool_choice` required or a named function
(llguidance Lark text): the call, in the dialect's own notation, right after any reasoning,
each tool's `parameters` schema enforced on its arguments; under `auto`, free text until
the trigger word, then the calls so constrained. Gemma 4 (its own value notation, built from the
schema) and DeepSeek V3.2/V4 (DSML parameters, JSON where `string="false"`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.special import dsml, gemma4, minimax_m3
from loraserve.chat.formats.special.grammars_more import (
    functionary_auto,
    functionary_body,
    lfm2_body,
    minimax_m3_body,
    muse_auto,
    muse_body,
)
from loraserve.chat.formats.special.grammars_tagged import (
    cohere2_body,
    kimi_k3_body,
    ling3_body,
)
from loraserve.chat.formats.special.lark import (
    NUMBER,
    Lark,
    closed,
    integer,
    json_value,
    members,
)
from loraserve.chat.formats.special.text import may_be_string, types_of


def _gemma_value(g: Lark, schema: Any) -> str:
    schema = schema if isinstance(schema, dict) else {}
    quote = g.q(gemma4.QUOTE)
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return f"{quote} ({' | '.join(json.dumps(v) for v in schema['enum'])}) {quote}"
    kinds = types_of(schema)
    options = []
    if "string" in kinds:
        options.append(f"{quote} {g.string_until(schema, gemma4.QUOTE)}")
    if "integer" in kinds:
        options.append(integer(schema))
    if "number" in kinds:
        options.append(NUMBER)
    if "boolean" in kinds:
        options.append('"true" | "false"')
    if "null" in kinds:
        options.append('"null"')
    if "array" in kinds:
        item = _gemma_value(g, schema.get("items"))
        options.append(f'"[" ({item} ("," {item})*)? "]"')
    if "object" in kinds or (not kinds and schema.get("properties")):
        options.append(_gemma_object(g, schema))
    if not options:
        return _gemma_any(g)
    return g.rule(" | ".join(options))


def _gemma_any(g: Lark) -> str:
    """Any value in Gemma's notation (one recursive rule per grammar)."""
    if "gemma_any" not in g.named:
        g.named["gemma_any"] = name = g.rule("")
        quote = g.q(gemma4.QUOTE)
        member = f'/[A-Za-z_][A-Za-z0-9_]*/ ":" {name}'
        body = (
            f'{quote} {g.text_until(gemma4.QUOTE)} | {NUMBER} | "true" | "false" | '
            f'"null" | "[" ({name} ("," {name})*)? "]" | '
            f'"{{" ({member} ("," {member})*)? "}}"'
        )
        g.rules[int(name[1:]) - 1] = f"{name}: {body}"
    return g.named["gemma_any"]


def _gemma_object(g: Lark, schema: dict[str, Any]) -> str:
    """An object with properties: its keys in sorted order (Gemma's template writes them
    through `dictsort`), each at most once, the required ones always."""
    props = schema.get("properties")
    if not props:
        return _gemma_any(g)
    required = set(schema.get("required") or [])
    first, after = "", ""  # the members from key i on: first of all / after another one
    for key in sorted(props, reverse=True):
        member = g.rule(f'"{key}:" {_gemma_value(g, props[key])}')
        if key in required:
            first, after = g.rule(f"{member} {after}"), g.rule(f'"," {member} {after}')
        else:
            alt = f"{member} {after}" + (f" | {first}" if first else "")
            first = g.rule(alt)
            after = g.rule(f'("," {member})? {after}') if after else f'("," {member})?'
    return g.rule(f'"{{" {first}{"" if required else "?"} "}}"')


def _gemma4(
    g: Lark, tools: list[dict[str, Any]], parallel: bool, thinking_open: bool
) -> tuple[str, str]:
    """(the thought, the calls after the first one's trigger). The thought: an optional
    `<|channel>thought ..<channel|>` block, or where the prompt opened it (a reasoning
    prefill: llama.cpp's generation prompt `<|channel>thought\n` + the prefill) its rest
    and `<channel|>` (required under `required`, as llama.cpp's `thought` rule)."""
    calls = []
    for t in tools:
        fn = t["function"]
        args = _gemma_object(g, fn.get("parameters") or {})
        calls.append(g.rule(f'"call:{fn["name"]}" {args} {g.q(gemma4.CALL_END)}'))
    rest = g.rule(" | ".join(calls))  # a call after its trigger
    call = g.rule(f"{g.q(gemma4.CALL)} {rest}")
    thought = g.reasoning_until(gemma4.CHANNEL_END)
    think = thought if thinking_open else f"({g.q(gemma4.THOUGHT)} {thought})?"
    return think, (f"{rest} {call}*" if parallel else rest)


def _dsml(g: Lark, tools: list[dict[str, Any]], parallel: bool, v4: bool) -> str:
    start, end = dsml.block(v4)
    calls = []
    for t in tools:
        fn = t["function"]

        def member(key: str, sub: Any) -> str:
            text = may_be_string(sub)
            head = g.q(f'{dsml.PARAM}{key}" string="{"true" if text else "false"}">')
            end = dsml.PARAM_END
            value = g.string_until(sub, end) if text else f"{json_value(sub)} {g.q(end)}"
            return g.rule(f"{head} {value}")

        # llama.cpp's `space` between the arguments, the calls and the block's markers
        args = members(g, closed(fn.get("parameters") or {}), member, "WS")
        head = g.q(f'{dsml.INVOKE}{fn["name"]}">\n')
        calls.append(g.rule(f"{head} {args} WS {g.q(dsml.INVOKE_END)}"))
    call = g.rule(" | ".join(calls))
    more = f"(WS {call})*" if parallel else ""
    return f"WS {call} {more} WS {g.q(end)}"  # after the block's start (the trigger)


def _lazy(
    g: Lark, fmt: ChatFormat, think: str, rest: str, lazy: bool, opened: bool = False,
    ends_inside: bool = False,
) -> str:  # fmt: skip
    """The answer: the reasoning, then (`required`) the trigger and `rest`, the calls after
    it; or (`auto`) free text until the trigger, the calls, free text that holds no trigger.
    Text never holds a special token, so a trigger that starts with one ends the text by
    itself (the dialect's other special tokens allowed in between); a trigger that starts
    with text ends it through a lazy rule (its first occurrence). A trigger written inside
    the reasoning is the reasoning's (llama.cpp's lazy grammar ignores it there): the text
    before the calls never holds the reasoning's text opener that `think` may start with
    (its end, when the prompt `opened` the reasoning), else the lexer would end that text at
    the trigger and refuse the real call after the reasoning; `ends_inside`: `think` is the
    rest of the reasoning the prompt opened, and the answer may instead end inside it."""
    trigger = g.q(fmt.trigger)
    if not lazy:
        return f"{think} {trigger} {rest}"
    r_end = fmt.reasoning_end.strip()
    marker = (r_end if opened else fmt.reasoning_start.strip()) if think else ""
    avoid = marker if marker and g.q(marker).startswith('"') else ""
    head = g.text_head(fmt.trigger)
    if head:  # text first: `]<]minimax[>[` before <tool_call>, or no special token at all
        tail = g.not_containing(head, avoid)
        text = g.not_containing(avoid) if avoid else "TEXT"
        lead = g.rule(f"{text} {json.dumps(head)}", lazy=True)
        more = g.q(fmt.trigger[len(head) :]) if len(head) < len(fmt.trigger) else ""
        after = f"({lead} {more} {rest} {tail} | {tail})"
    else:
        others = [t for t in fmt.preserved_tokens if t != fmt.trigger and g.q(t) == t]
        tail = g.rule(f"TEXT (({' | '.join(others)}) TEXT)*") if others else "TEXT"
        after = f"{tail} ({trigger} {rest} {tail})?"
    if not ends_inside:
        return f"{think} {after}"
    if g.q(r_end).startswith('"'):  # the answer ends inside the reasoning: no end in it
        return f"({think} {after} | {g.not_containing(r_end)})"
    inner = [t for t in fmt.preserved_tokens if t != r_end and g.q(t) == t]
    unended = f"TEXT (({' | '.join(inner)}) TEXT)*" if inner else "TEXT"
    return f"({think} {after} | {unended})"


# under `required` without a reasoning block of its own (reasoning_format none, or a prompt
# that closed the block: thinking off), what these dialects' answers may start with instead
# of their optional block
_NO_BLOCK: dict[str, Callable[[Lark], str]] = {
    "minimax_m3": lambda g: f"({g.q(minimax_m3.THINK_END)})?",  # a turn without: bare end
    "lfm2": lambda g: "",
}


def _new_block(g: Lark, fmt: ChatFormat) -> str:
    """One optional reasoning block the answer opens itself before a forced call, with the
    format's reasoning markers (llama.cpp's reasoning parser: `space` around them)."""
    r_start, r_end = fmt.reasoning_start.strip(), fmt.reasoning_end.strip()
    if not (r_start and r_end):
        return ""
    return f"(WS {g.q(r_start)} {g.reasoning_until(r_end)} WS)?"


def dialect_grammar(
    fmt: ChatFormat,
    tools: list[dict[str, Any]],
    choice: str,
    parallel: bool = True,
    thinking_open: bool = False,
    special: Callable[[str], bool] = lambda s: False,
    started: bool = False,
    reasoning: bool = True,
) -> str | None:
    """Lark text forcing a call under `choice` ("required" or a function's name) in `fmt`'s
    dialect, or for `auto` constraining the calls from their trigger on (Muse's and
    Functionary's, whose triggers are patterns, from the message that names a tool); None
    where the dialect has no grammar for the choice. `started`: the prompt already wrote
    the trigger (an assistant prefill), so the answer is the rest of the calls.
    `reasoning`: a forced call may come after one reasoning block the answer opens itself
    (as `tool_grammar`'s); the rest of a block the prompt opened comes first regardless."""
    if choice == "none" or not tools:
        return None
    lazy = choice == "auto"
    if choice not in ("required", "auto"):
        tools = [t for t in tools if t["function"]["name"] == choice]
        if not tools:
            raise ValueError(f"tool_choice names a function that is not in tools: {choice}")
    if fmt.dialect == "gemma_4":
        g = Lark(special, fmt.preserved_tokens)
        think, rest = _gemma4(g, tools, parallel, thinking_open)
        if started:
            return g.lark(rest)
        think = think if lazy or thinking_open or reasoning else ""  # may end inside the
        inside = lazy and thinking_open  # opened thought (`auto`)
        return g.lark(_lazy(g, fmt, think, rest, lazy, thinking_open, inside))
    if fmt.dialect in ("deepseek_v3_2", "deepseek_v4"):
        g = Lark(special, (dsml.DSML,))
        rest = _dsml(g, tools, parallel, fmt.dialect == "deepseek_v4")
        if started:
            return g.lark(rest)
        # reasoning the prompt opened ends at </think>, or where the calls start
        think = f"({g.text_until(dsml.THINK_END)} WS)?" if thinking_open else ""
        if not (lazy or thinking_open) and reasoning:
            think = _new_block(g, fmt)
        return g.lark(_lazy(g, fmt, think, rest, lazy, thinking_open))
    triggered = {"ling_3": ling3_body, "kimi_k3": kimi_k3_body, "cohere2_moe": cohere2_body,
                 "minimax_m3": minimax_m3_body, "lfm2": lfm2_body}  # fmt: skip
    whole = {"muse_glimmer": muse_body, "functionary_v3_2": functionary_body}
    whole_auto = {"muse_glimmer": muse_auto, "functionary_v3_2": functionary_auto}
    dialect = "lfm2" if fmt.dialect == "lfm2_plain" else fmt.dialect
    g = Lark(special, fmt.preserved_tokens)
    if dialect in triggered:
        think, rest = triggered[dialect](g, tools, parallel, thinking_open)
        if started:
            return g.lark(rest)
        if not lazy and not thinking_open:  # required: the body's own optional block or
            if dialect in _NO_BLOCK:  # none (one the prompt opened ends first regardless)
                think = think if reasoning else _NO_BLOCK[dialect](g)
            elif reasoning:
                think = _new_block(g, fmt)
        inside = lazy and thinking_open and dialect in _NO_BLOCK  # may end inside it
        return g.lark(_lazy(g, fmt, think, rest, lazy, thinking_open, inside))
    if dialect in whole:
        if lazy:
            return g.lark(whole_auto[dialect](g, tools, parallel, thinking_open))
        new = reasoning and not thinking_open  # Muse: a ` to=self` message first
        return g.lark(whole[dialect](g, tools, parallel, thinking_open, new))
    return None
