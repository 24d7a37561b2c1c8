"""Tagged tool calls (a tagged name with JSON arguments, or tagged name and arguments: Qwen3
Coder's `<parameter=k>v</parameter>`, GLM's `<arg_key>`), scanned from a format's markers;
tagged values are JSON-escaped as they come, typed by the tool's parameter schema.
"""

from __future__ import annotations

import json
from typing import Any

from loraserve.chat.formats.call_markers import CallScan, ScannedCall
from loraserve.chat.formats.call_markers import Need as _Need
from loraserve.chat.formats.call_markers import lit as _lit
from loraserve.chat.formats.call_markers import opt as _opt
from loraserve.chat.formats.call_markers import until as _until
from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.scan import Incomplete, Invalid, held, skip_ws, value_end
from loraserve.chat.formats.values import cdata, typed
from loraserve.chat.formats.values import is_string as _is_string


def tag_calls(
    fmt: ChatFormat,
    text: str,
    i: int,
    out: CallScan,
    schemas: dict[str, dict[str, Any]],
    partial: bool,
) -> None:
    """The tagged calls of `text` from `i` (past the section start) into `out`; `Need` when
    the text ends before the next thing is decided."""
    name_stops = (fmt.name_suffix, fmt.args_separator, fmt.args_start, "{")
    if fmt.tool_mode == "tag_tagged":  # Hy3's name ends at its separator: NAME<tool_sep>
        name_stops = (fmt.name_suffix, fmt.args_separator, fmt.args_start, fmt.arg_name_prefix,
                      "\n", fmt.call_close, fmt.call_end)  # fmt: skip
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
        id_ = ""
        if fmt.id_position == "pre_name" and fmt.id_suffix.strip():  # Solar Open: ID<|..:name|>
            k = _opt(text, i, fmt.id_prefix)
            e = _until(text, k, fmt.id_suffix)
            id_, i = text[k:e].strip(), _lit(text, e, fmt.id_suffix)
        n = skip_ws(text, i)
        e = _until(text, n, *name_stops, *id_stops)
        name = text[n:e].strip()
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
