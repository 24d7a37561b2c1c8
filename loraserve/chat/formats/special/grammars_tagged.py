"""`required` grammars of the tagged dialects: Ling 3 (`<arg_key>`/`<arg_value>`), Kimi K3
(`<|open|>argument key=".."<|sep|>` elements) and Cohere2 MoE (a JSON action array). Each
returns (the reasoning the answer may start with, the calls after their trigger);
`thinking_open`: the prompt opened the reasoning block."""

from __future__ import annotations

from typing import Any

from loraserve.chat.formats.special import cohere2, kimi_k3, ling3
from loraserve.chat.formats.special.lark import (
    Lark,
    any_order,
    closed,
    json_value,
    optional_runs,
    permuted,
)
from loraserve.chat.formats.special.text import types_of


def _value(g: Lark, schema: Any, end: str) -> str:
    """A tagged value up to and past `end`: text where only strings are allowed, JSON where
    no string is, either otherwise."""
    kinds = types_of(schema)
    text = g.string_until(schema, end)
    if kinds == {"string"}:
        return text
    typed = f"{json_value(schema)} {g.q(end)}"
    return typed if "string" not in kinds and kinds else g.rule(f"{typed} | {text}")


def ling3_body(
    g: Lark, tools: list[dict[str, Any]], parallel: bool, thinking_open: bool
) -> tuple[str, str]:
    """Ling 3.0: `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>..
    </tool_call>`; reasoning the prompt opened ends at `</think>`."""
    calls = []
    for t in tools:
        fn = t["function"]

        def member(key: str, sub: Any) -> str:
            head = f'{g.q(ling3.KEY)} "{key}" {g.q(ling3.KEY_END)} WS {g.q(ling3.VALUE)}'
            return g.rule(f"{head} {_value(g, sub, ling3.VALUE_END)}")

        params = fn.get("parameters") or {}
        props = params.get("properties") or {}
        need = [k for k in props if k in (params.get("required") or [])]
        opt = [member(k, v) for k, v in props.items() if k not in need]
        one = g.rule(" | ".join(opt)) if opt else ""
        # llama.cpp's: the required ones once each in any order, the optional ones any number
        args = permuted(g, [member(k, props[k]) for k in need], "WS")
        args += f" (WS {one}){{0,{optional_runs(len(opt))}}}" if one else ""
        calls.append(g.rule(f'"{fn["name"]}" {args} WS {g.q(ling3.CALL_END)}'))
    rest = g.rule(" | ".join(calls))
    more = f"(WS {g.q(ling3.CALL)} {rest})*" if parallel else ""
    tail = f"({g.q(ling3.ROLE_END)})?"  # llama.cpp reads text after the calls as content
    think = f"({g.reasoning_until(ling3.THINK_END, (ling3.CALL,))} WS)?" if thinking_open else ""
    return think, f"{rest} {more} {g.rule(f'TEXT {tail}')}"


def kimi_k3_body(
    g: Lark, tools: list[dict[str, Any]], parallel: bool, thinking_open: bool
) -> tuple[str, str]:
    """Kimi K3: `<|open|>tools<|sep|>` calls `<|close|>tools<|sep|>`, each call
    `<|open|>call tool="NAME" index="N"<|sep|>` argument elements `<|close|>call<|sep|>`."""
    calls = []
    for t in tools:
        fn = t["function"]

        def member(key: str, sub: Any) -> str:
            head = (
                f'{g.q(kimi_k3.ARG)} "{key}\\" type=\\"" /[a-z]{{1,10}}/ "\\"" {g.q(kimi_k3.SEP)}'
            )
            return g.rule(f"{head} {_value(g, sub, kimi_k3.ARG_END)}")

        # llama.cpp's: `zero_or_more` of any argument (ours: the required ones once each)
        args = any_order(g, closed(fn.get("parameters") or {}), member, "")
        head = f'{g.q(kimi_k3.CALL)} "{fn["name"]}\\" index=\\"" /[0-9]{{1,3}}/ "\\"" '
        calls.append(g.rule(f"{head} {g.q(kimi_k3.SEP)} {args} {g.q(kimi_k3.CALL_END)}"))
    call = g.rule(" | ".join(calls))
    end = f"{g.q(kimi_k3.TOOLS_END)} ({g.q(kimi_k3.MSG_END)})?"
    think = f"({g.reasoning_until(kimi_k3.THINK_END)})?" if thinking_open else ""
    return think, f"{call}{'+' if parallel else ''} {end}"


def cohere2_body(
    g: Lark, tools: list[dict[str, Any]], parallel: bool, thinking_open: bool
) -> tuple[str, str]:
    """Cohere2 MoE: `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": NAME,
    "parameters": {..}}, ..]<|END_ACTION|>`."""
    objects = []
    for t in tools:
        fn = t["function"]
        props = {
            "tool_call_id": {"type": "string", "pattern": "^[0-9]{1,3}$"},
            "tool_name": {"const": fn["name"]},
            "parameters": closed(fn.get("parameters") or {"type": "object"}),
        }
        schema = {"type": "object", "properties": props, "required": list(props),
                  "additionalProperties": False}  # fmt: skip
        objects.append(json_value(schema))
    one = g.rule(" | ".join(objects))
    more = f'("," SP {one})*' if parallel else ""
    think = f"({g.reasoning_until(cohere2.THINK_END)})?" if thinking_open else ""
    return think, f'"[" SP {one} {more} SP "]" {g.q(cohere2.ACTION_END)}'
