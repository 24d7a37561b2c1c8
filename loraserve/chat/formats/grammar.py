"""The grammar that constrains a tool-calling answer, as llguidance Lark text, from the same
`ChatFormat` the parser reads.

- ``auto``: lazy. Free text until the trigger marker (the call section's or each call's
  start), then a call of one of the tools, each tool's `parameters` schema enforced on its
  arguments; text after it; more calls only with `parallel_tool_calls`. Reasoning is parsed
  first, so a trigger written inside it constrains nothing. No trigger (Llama 3.x's bare
  JSON): no grammar, as in llama-server.
- ``required`` / a named function: the call (of that function) right after the reasoning,
  with no text before it (**ours**: llama-server lets `required` write text first and
  treats a named function as `auto`; OpenAI defines both as a forced call). The reasoning:
  the rest of the block the prompt opened, or else, where the request extracts reasoning
  (`reasoning`: its reasoning_format is not none) and the prompt did not close a block
  itself (thinking off), one optional block the answer opens, as llama.cpp's grammar
  (`reasoning? content? calls`, fed the generation prompt) allows; the reasoning budget
  ends it as any other block.

Markers that are special tokens of the model's vocabulary are written as llguidance's
`<token>` references (`special`), the rest as text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.grammar_args import TaggedArgs
from loraserve.chat.formats.harmony_grammar import harmony_grammar
from loraserve.chat.formats.special.grammars import dialect_grammar
from loraserve.chat.formats.special.lark import SPACE, STYLE

ANY = r"/(.|\n)*/"


def _json(schema: dict[str, Any]) -> str:
    """An embedded JSON value of `schema`, spaced as llama.cpp's schema grammars allow
    (its bounded `space` between tokens: a free whitespace choice would let a small model
    write spaces forever)."""
    return "%json " + json.dumps({"x-guidance": STYLE, **schema})


def _not_containing(*markers: str) -> str:
    parts = [ANY] + [f"~/(.|\\n)*{_rx(m)}(.|\\n)*/" for m in markers if m]
    return " & ".join(parts)


def _rx(text: str) -> str:
    out = ""
    for c in text:
        if c == "\n":
            out += "\\n"
        elif c in "\\.+*?()|[]{}^$/":
            out += "\\" + c
        else:
            out += c
    return out


def _closed(params: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters with no properties beyond those listed unless it allows them
    (llama.cpp's json-schema-to-grammar reads a missing `additionalProperties` so)."""
    if params.get("properties") and "additionalProperties" not in params:
        return {**params, "additionalProperties": False}
    return params


class _Builder(TaggedArgs):
    def __init__(self, fmt: ChatFormat, special: Callable[[str], bool]) -> None:
        self.fmt = fmt
        self.special = special
        self.rules: list[str] = []
        self.n = 0

    def json_value(self, schema: Any) -> str:
        return _json(schema if isinstance(schema, dict) else {})

    def q(self, marker: str) -> str:
        """A marker as grammar items (its whitespace as text, a special token as a token)."""
        core = marker.strip()
        if not core:
            return json.dumps(marker) if marker else ""
        # llguidance names a special token by its text when that is `<..>`; others: text
        named = core.startswith("<") and core.endswith(">") and ">" not in core[1:-1]
        if not (named and self.special(core)):
            return json.dumps(marker)
        lead = marker[: marker.find(core)]
        trail = marker[marker.find(core) + len(core) :]
        return " ".join(x for x in (json.dumps(lead) if lead else "", core,
                                    json.dumps(trail) if trail else "") if x)  # fmt: skip

    def rule(self, body: str, lazy: bool = False) -> str:
        self.n += 1
        name = f"r{self.n}"
        self.rules.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def call(self, tool: dict[str, Any], with_start: bool) -> str:
        f = self.fmt
        fn = tool["function"]
        name = fn["name"]
        params = _closed(fn.get("parameters") or {"type": "object"})
        items = [self.q(f.call_start) if with_start else ""]
        if f.tool_mode == "json":
            items.append(_json(self._call_schema(name, params)))
        else:
            if f.id_position == "pre_name" and f.id_suffix.strip():  # Solar Open's own id
                items += [self.q(f.id_prefix), r"/[A-Za-z0-9_\-]{1,40}/", self.q(f.id_suffix)]
            items += [self.q(f.name_prefix), json.dumps(name)]
            if f.name_id_index:
                items.append('":" /[0-9]{1,2}/')  # the call's index, bounded
            between = f.id_position == "between_name_and_args" and f.id_prefix
            # Mistral Small 3.2: NAME[CALL_ID]ID[ARGS]{..}, the name's suffix is the id's
            suffix = "" if between and f.name_suffix == f.id_suffix else f.name_suffix
            sep = f"WS {self.q(f.args_separator)}" if f.args_separator else ""
            items += [self.q(suffix) if suffix else "", sep]
            if between:
                items += [self.q(f.id_prefix), "/[a-zA-Z0-9]{9}/", self.q(f.id_suffix)]
            items += ["WS", self.q(f.args_start)]  # llama.cpp: `space` before the arguments
            if f.tool_mode == "tag_json":
                items.append(_json(params))
            else:
                items.append(self.tagged_args(params))
            items += ["WS", self.q(f.args_end), "WS", self.q(f.call_close)]
        if f.call_end:  # Kimi K2's may be left out (llama.cpp: an optional tool_close)
            end = f"({self.q(f.call_end)})?" if f.detector == "kimi_k2" else self.q(f.call_end)
            items += ["WS", end]
        return self.rule(" ".join(x for x in items if x))

    def _call_schema(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        f = self.fmt
        optional = f.gen_id_field.rpartition(".")[2] if f.gen_id_field else ""
        if f.fun_name_is_key:
            props: dict[str, Any] = {name: params}
        else:
            name_key = (f.name_field or "name").rpartition(".")[2]
            args_key = (f.args_field or "arguments").rpartition(".")[2]
            fields = {name_key: {"const": name}, args_key: params}
            if f.id_field:
                fields[f.id_field.rpartition(".")[2]] = {
                    "type": "string",
                    "pattern": "^[a-zA-Z0-9]{9}$",
                }
            if optional:  # an id the model may write (Command R7B's "tool_call_id": "0")
                fields[optional] = {"type": ["string", "number"]}
            order = [k.rpartition(".")[2] for k in f.parameter_order] or list(fields)
            props = {k: fields[k] for k in order if k in fields}
            props.update({k: v for k, v in fields.items() if k not in props})
        required = [k for k in props if k != optional]
        return {"type": "object", "properties": props, "required": required,
                "additionalProperties": False}  # fmt: skip


def tool_grammar(
    fmt: ChatFormat,
    tools: list[dict[str, Any]],
    choice: str,
    parallel: bool = True,
    reasoning: bool = True,
    thinking_open: bool = False,
    special: Callable[[str], bool] = lambda s: False,
    started: bool = False,
) -> str | None:
    """llguidance Lark text constraining an answer with these tools under `choice`
    ("auto", "required", or a function's name), or None when nothing is constrained.
    `reasoning`: under `required` / a named function, a reasoning block the answer opens
    itself may come before the call (the request extracts reasoning and the prompt did not
    close a block); `thinking_open`: the prompt opened one, whose rest comes first.
    `started`: the prompt already wrote the trigger (an assistant prefill), so the answer
    is the rest of the calls, whatever the choice."""
    if not fmt.has_tools or not tools or choice == "none":
        return None
    if choice not in ("auto", "required"):
        tools = [t for t in tools if t["function"]["name"] == choice]
        if not tools:
            raise ValueError(f"tool_choice names a function that is not in tools: {choice}")
    if fmt.dialect == "harmony":
        return harmony_grammar(fmt, tools, choice, thinking_open, special)
    if fmt.dialect:  # the specialised formats' own grammars (None where there is none yet)
        return dialect_grammar(fmt, tools, choice, parallel, thinking_open, special, started,
                               reasoning)  # fmt: skip
    if fmt.array_wrapped and fmt.call_start and not fmt.section_start:  # Nemotron Nano v2:
        fmt = fmt.with_(section_start=fmt.call_start, section_end=fmt.call_end,  # its markers
                        call_start="", call_end="")  # wrap the whole array  # fmt: skip
    trigger = fmt.trigger
    if choice == "auto" and not trigger:
        return None
    b = _Builder(fmt, special)
    lazy = choice == "auto" and not started
    with_start = not (fmt.section_start == "" and (lazy or started))
    first = b.rule(" | ".join(b.call(t, with_start) for t in tools))
    one = b.rule(" | ".join(b.call(t, True) for t in tools)) if not with_start else first
    if fmt.array_wrapped:
        more = f'(WS "," WS {one})*' if parallel else ""
        calls = f'"[" WS {first} {more} WS "]"'
        first_calls = calls
    else:
        more = f"(WS {one})*" if parallel and fmt.call_start else ""
        calls = f"{first} {more}".strip()
        first_calls = calls
    section = fmt.section_start
    if section:
        pre = "" if lazy or started else b.q(section)
        end = f"WS {b.q(fmt.section_end)}" if fmt.section_end else ""
        first_calls = f"{pre} {calls} {end}".strip()
    if fmt.optional_markers:  # Kimi K2: the section's markers, which the model may omit
        opt = [f"({b.q(m)})?" for m in fmt.optional_markers[:2]]
        first_calls = f"{opt[0]} {first_calls} {' '.join(['WS', *opt[1:]])}"
    body_calls = b.rule(first_calls)
    r_start, r_end = fmt.reasoning_start.strip(), fmt.reasoning_end.strip()
    think = ""
    new_block = reasoning and bool(r_start) and not started  # required: the answer opens one
    if fmt.reasoning_mode != "none" and r_end and (lazy or thinking_open or new_block):
        inner = b.rule(f"TEXT {b.q(r_end)}", lazy=True)
        if thinking_open or not r_start:
            think = inner
            if lazy and thinking_open and trigger.strip() in fmt.reasoning_stops:
                think = f"({inner})?"  # the reasoning may end at the calls (Qwen3.5)
        elif lazy and trigger.strip() in fmt.reasoning_stops:  # Kimi K2: ends at the calls
            think = f"({b.q(r_start)} ({inner})?)?"
        elif lazy:
            think = f"({b.q(r_start)} {inner})?"
        else:  # required: one block the answer opens (llama.cpp: `space` around its start)
            think = f"(WS {b.q(r_start)} {inner})?"
    lines = ["%llguidance {}"]
    if started:
        lines.append(f"start: WS {body_calls} WS")
    elif lazy:
        trig = trigger.strip()
        avoid = [trig] + ([r_start] if r_start and not b.special(r_start) else [])
        tail = "TAIL"
        if b.q(trig) != json.dumps(trig):  # the trigger is a special token
            rest = b.q(trigger[trigger.find(trig) + len(trig) :])
            tag = f"{tail} {b.q(trig)} {rest} {body_calls}"
        else:
            lead = b.rule(f"LEAD {json.dumps(trigger)}", lazy=True)
            tag = f"{lead} {body_calls}"
        tag_rule = b.rule(tag)
        reps = f"{tag_rule}*" if parallel else f"{tag_rule}?"
        lines.append(f"start: {think} {reps} {tail}".replace("  ", " "))
        lines.append(f"LEAD: {_not_containing(*([r_start] if r_start else []))}")
        lines.append(f"TAIL: {_not_containing(*avoid)}")
    else:
        lines.append(f"start: {think} WS {body_calls} WS".replace("  ", " "))  # llama.cpp: `space`
    lines.append(f"WS: /{SPACE}/")  # llama.cpp's `space`, bounded
    lines.append(f"TEXT: {ANY}")
    return "\n".join(lines + b.rules) + "\n"
