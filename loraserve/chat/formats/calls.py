"""The tool calls of an answer, from the trigger on, in the three modes of a `ChatFormat`
(JSON objects, a tagged name with JSON arguments, tagged name and arguments).

Markers match with the whitespace around them optional (a model often drops the newline a
template writes). A partial text stops at the first thing it cannot decide yet; the last
call is reported once its name is known, with the arguments written so far (JSON text that
only grows: tagged values are JSON-escaped as they come, closing quote and brace added at the
end).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.scan import (
    Incomplete,
    Invalid,
    held,
    loads,
    object_members,
    skip_ws,
    value_end,
)
from loraserve.chat.formats.values import cdata, typed
from loraserve.chat.formats.values import is_string as _is_string  # grammar.py reads it here


@dataclass
class ScannedCall:
    """One call as scanned: name, arguments JSON text (maybe partial), id ("" if none)."""

    name: str
    arguments: str
    id: str = ""


@dataclass
class CallScan:
    """The calls found and where the scan stopped."""

    calls: list[ScannedCall] = field(default_factory=list)
    end: int = 0


class _Need(Exception):
    """The text ends before this can be decided."""


def _lit(text: str, i: int, marker: str) -> int:
    """Past `marker` (whitespace around it optional) at `i`; _Need / Invalid otherwise."""
    m = marker.strip()
    if not m:
        return i
    j = skip_ws(text, i)
    if text.startswith(m, j):
        return j + len(m)
    if m.startswith(text[j:]):
        raise _Need
    raise Invalid


def _opt(text: str, i: int, marker: str) -> int:
    try:
        return _lit(text, i, marker)
    except Invalid:
        return i


def _until(text: str, i: int, *stops: str) -> int:
    """The first position of any of `stops` (trimmed, non-empty) from `i`; _Need if none."""
    found = [text.find(s.strip(), i) for s in stops if s.strip()]
    found = [f for f in found if f >= 0]
    if not found:
        raise _Need
    return min(found)


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
            _tag_calls(fmt, text, i, out, schemas, partial)
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


def _tag_calls(
    fmt: ChatFormat,
    text: str,
    i: int,
    out: CallScan,
    schemas: dict[str, dict[str, Any]],
    partial: bool,
) -> None:
    name_stops = (fmt.name_suffix, fmt.args_separator, fmt.args_start, "{")
    if fmt.tool_mode == "tag_tagged":
        name_stops = (fmt.name_suffix, fmt.args_start, fmt.arg_name_prefix, "\n",
                      fmt.call_close, fmt.call_end)  # fmt: skip
    between = fmt.id_position == "between_name_and_args" and fmt.id_prefix.strip()
    id_stops = (fmt.id_prefix.strip(),) if between and fmt.tool_mode == "tag_json" else ()
    while True:
        try:
            if fmt.call_start and fmt.call_start_optional and not out.calls:
                i = _opt(text, i, fmt.call_start)
            elif fmt.call_start:
                i = _lit(text, i, fmt.call_start)
            i = _lit(text, i, fmt.name_prefix) if fmt.name_prefix != fmt.call_start else i
        except Invalid:
            if out.calls:
                break
            raise
        n = skip_ws(text, i)
        e = _until(text, n, *name_stops, *id_stops)
        name, id_ = text[n:e].strip(), ""
        if fmt.name_id_index:
            id_ = fmt.name_prefix.strip() + name
            name = name.rpartition(":")[0] or name
        if id_stops and text.startswith(id_stops[0], e):  # Mistral Small 3.2: NAME[CALL_ID]ID[ARGS]
            k = e + len(id_stops[0])
            e = _until(text, k, fmt.id_suffix, fmt.args_start, "{")
            id_, i = text[k:e].strip(), _opt(text, e, fmt.id_suffix)
            if fmt.name_suffix.strip() != fmt.id_suffix.strip():
                i = _lit(text, i, fmt.name_suffix)
        else:
            i = _lit(text, e, fmt.name_suffix)
        i = _lit(text, i, fmt.args_separator)
        if fmt.id_position == "between_name_and_args" and fmt.id_prefix and not id_:
            k = _opt(text, i, fmt.id_prefix)
            if k != i:
                e = _until(text, k, fmt.id_suffix, fmt.args_start, "{")
                id_, i = text[k:e].strip(), _opt(text, e, fmt.id_suffix)
        i = _lit(text, i, fmt.args_start)
        call = ScannedCall(name, "", id_)
        if fmt.tool_mode == "tag_json":
            v = skip_ws(text, i)
            try:
                end = value_end(text, v)
            except Incomplete:
                call.arguments = text[v:]
                out.calls.append(call)
                raise _Need from None
            call.arguments = text[v:end]
            i = end
        else:
            i = _tagged_args(fmt, text, i, call, schemas.get(name, {}), out, partial)
        out.calls.append(call)
        i = _lit(text, i, fmt.args_end)
        i = _lit(text, i, fmt.call_close)
        i = _opt(text, i, fmt.call_end) if fmt.optional_markers else _lit(text, i, fmt.call_end)
        out.end = i
        k = skip_ws(text, i)
        if k < len(text) and text[k] == "," and not fmt.call_start:
            i = k + 1
    out.end = _opt(text, out.end, fmt.section_end)


def _tagged_args(
    fmt: ChatFormat,
    text: str,
    i: int,
    call: ScannedCall,
    schema: dict[str, Any],
    out: CallScan,
    partial: bool,
) -> int:
    props = schema.get("properties") or {}
    parts: list[str] = []
    while True:
        try:
            i = _tagged_arg(fmt, text, i, props, parts, partial)
        except Invalid:
            break
        except _Need:
            call.arguments = "{" + ", ".join(parts)
            out.calls.append(call)
            raise
        if i < 0:
            call.arguments = "{" + ", ".join(parts)
            out.calls.append(call)
            raise _Need
    call.arguments = "{" + ", ".join(parts) + "}"
    return i


def _tagged_arg(
    fmt: ChatFormat, text: str, i: int, props: dict[str, Any], parts: list[str], partial: bool
) -> int:
    """One tagged argument from `i` appended to `parts` (`"key": value` JSON text); the
    position after it, or -1 when the text ends inside a string value (its part then holds
    the value so far, unclosed). Invalid when no argument starts at `i`."""
    k = _lit(text, i, fmt.arg_name_prefix)
    e = _until(text, k, fmt.arg_name_suffix, fmt.arg_value_prefix, fmt.arg_value_suffix)
    key = text[k:e].strip()
    v = _lit(text, _lit(text, e, fmt.arg_name_suffix), fmt.arg_value_prefix)
    head = json.dumps(key, ensure_ascii=False) + ": "
    if fmt.cdata_values and _is_string(props.get(key)):
        got = cdata(text, v, head, parts)
        if got == -2:
            raise _Need
        if got is not None:
            return got if got < 0 else _opt(text, _lit(text, got, fmt.arg_value_suffix),
                                            fmt.arg_separator)  # fmt: skip
    stop = fmt.arg_value_suffix.strip()
    closing_newline = fmt.arg_value_suffix.startswith("\n")  # Qwen3-Coder's `\n</parameter>`
    end = text.find(stop, v) if stop else -1
    raw = text[v:] if end < 0 else text[v:end]
    raw = raw[1:] if raw.startswith("\n") else raw
    if end < 0:
        if not _is_string(props.get(key)):
            raise _Need
        raw = raw[: len(raw) - held(raw, (stop,))]
        raw = raw.rstrip("\n") if closing_newline else raw
        parts.append(head + json.dumps(raw, ensure_ascii=False)[:-1])
        return -1
    raw = raw[:-1] if closing_newline and raw.endswith("\n") else raw
    parts.append(head + typed(raw, props.get(key)))
    return _opt(text, _lit(text, end, fmt.arg_value_suffix), fmt.arg_separator)
