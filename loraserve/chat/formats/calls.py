"""The tool calls of an answer, from the trigger on, in the three modes of a `ChatFormat`
(JSON objects, a tagged name with JSON arguments, tagged name and arguments).

Markers match with the whitespace around them optional (a model often drops the newline a
template writes). A partial text stops at the first thing it cannot decide yet; the last
call is reported once its name is known, with the arguments written so far (JSON text that
only grows: tagged values are JSON-escaped as they come, closing quote and brace added at the
end). Tagged calls are scanned in `calls_tagged`, the marker primitives are
`call_markers`'.
"""

from __future__ import annotations

import json
from typing import Any

from loraserve.chat.formats.call_markers import CallScan, ScannedCall
from loraserve.chat.formats.call_markers import Need as _Need
from loraserve.chat.formats.call_markers import lit as _lit
from loraserve.chat.formats.call_markers import opt as _opt
from loraserve.chat.formats.calls_tagged import tag_calls
from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.scan import (
    Incomplete,
    Invalid,
    loads,
    object_members,
    skip_ws,
)
from loraserve.chat.formats.values import is_string as _is_string  # grammar.py reads it here


def scan_calls(
    fmt: ChatFormat, text: str, at: int, partial: bool, schemas: dict[str, dict[str, Any]]
) -> CallScan:
    """The calls of `text` from `at` (the trigger's position)."""
    out = CallScan(end=at)
    if fmt.array_wrapped and fmt.call_start and not fmt.section_start:
        # Nemotron Nano v2's `<TOOLCALL>[{..}, {..}]</TOOLCALL>`: one marker pair around the array
        fmt = fmt.with_(section_start=fmt.call_start, section_end=fmt.call_end, call_start="",
                        call_end="")  # fmt: skip
    try:
        i = at
        for m in fmt.optional_markers:
            i = _opt(text, i, m)
        i = _lit(text, i, fmt.section_start)
        if fmt.tool_mode == "json":
            _json_calls(fmt, text, i, out)
        else:
            tag_calls(fmt, text, i, out, schemas, partial)
    except (_Need, Invalid, Incomplete):
        pass
    return out


def _json_calls(fmt: ChatFormat, text: str, i: int, out: CallScan) -> None:
    if fmt.array_wrapped:
        i = _opt(text, i, "[")
    while True:
        if fmt.call_start:
            try:
                i = _lit(text, i, fmt.call_start)
            except Invalid:
                break
        j = skip_ws(text, i)
        if j >= len(text):
            raise _Need
        if text[j] != "{":
            break
        members, end = object_members(text, j)
        call = _json_call(fmt, text, members)
        if end is None:
            if call is not None and call.name and (not fmt.id_field or call.id):
                out.calls.append(call)
            raise _Need
        if call is None or not call.name:
            raise Invalid
        out.calls.append(call)
        i = out.end = end
        i = out.end = _lit(text, i, fmt.call_end)
        k = skip_ws(text, i)
        if k < len(text) and text[k] in ",;":
            i = k + 1
        elif fmt.array_wrapped and k < len(text) and text[k] == "]":
            out.end = k + 1
            break
    out.end = _opt(text, out.end, fmt.section_end)


def _member(text: str, members: list[tuple[str, int, int | None]], path: str):  # noqa: ANN202
    """(start, end) of the member at dotted `path`, or None."""
    head, _, tail = path.partition(".")
    for key, start, end in members:
        if key == head:
            if not tail:
                return start, end
            if end is None or text[start] != "{":
                return None
            sub, _ = object_members(text, start)
            return _member(text, sub, tail)
    return None


def _json_call(fmt: ChatFormat, text: str, members: list) -> ScannedCall | None:
    if fmt.fun_name_is_key:
        if not members:
            return None
        key, start, end = members[0]
        return ScannedCall(key, text[start : len(text) if end is None else end])
    name_path = fmt.name_field or "name"
    found = _member(text, members, name_path)
    if found is None and _member(text, members, "function") is not None:
        name_path = "function.name"  # the OpenAI wrapper {"type": "function", "function": ..}
        found = _member(text, members, name_path)
    if found is None or found[1] is None:
        return ScannedCall("", "")
    name = loads(text[found[0] : found[1]])
    prefix = name_path.rpartition(".")[0]
    args = None
    for field_ in (fmt.args_field, "arguments", "parameters"):
        if field_:
            path = f"{prefix}.{field_.rpartition('.')[2]}" if prefix else field_
            args = _member(text, members, path)
            if args is not None:
                break
    arguments = "" if args is None else text[args[0] : len(text) if args[1] is None else args[1]]
    if args is not None and args[1] is not None and text[args[0]] == '"':
        arguments = loads(arguments)  # arguments written as a JSON string
    id_ = ""
    if fmt.id_field or fmt.gen_id_field:  # an id the model wrote, or one it generated
        got = _member(text, members, fmt.id_field or fmt.gen_id_field)
        if got is not None and got[1] is not None:
            value = loads(text[got[0] : got[1]])
            id_ = value if isinstance(value, str) else json.dumps(value)
    return ScannedCall(str(name), arguments, id_)


__all__ = ["CallScan", "ScannedCall", "_is_string", "scan_calls"]
