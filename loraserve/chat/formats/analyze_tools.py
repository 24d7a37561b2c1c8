"""The differential analyser's tool-call steps (llama.cpp's chat-diff-analyzer.cpp): the
tool-call section, its mode (JSON / tagged name / tagged arguments) and markers
(`tool_calls`), the JSON fields' names and order, parallel calls, and each call's own
markers (`per_call_markers`). The sentinels and the `Analysis` state are `analyze`'s."""

from __future__ import annotations

import json
from typing import Any

from loraserve.chat.formats.analyze import (
    ARG_FIRST,
    CALL_1,
    CALL_2,
    FUN_FIRST,
    TOOLS,
    USER,
    Analysis,
    _asst,
    _calls,
)
from loraserve.chat.formats.diff import (
    MARKER,
    SPACE,
    Tagged,
    diff_split,
    lit,
    trim,
    trim_leading,
    until,
    until_one_of,
)


def tool_calls(an: Analysis, parallel: bool) -> None:
    """The tool-call section, its mode (JSON / tagged name / tagged arguments) and markers."""
    c = an.compare([USER, _asst()], [USER, _calls(CALL_1)], TOOLS)
    if c is None or not c.diff.right:
        return
    hay = c.diff.right

    def in_json(needle: str) -> bool:
        return Tagged(rf"[{{:]{SPACE}{lit(chr(34) + needle + chr(34))}").search(hay) is not None

    if in_json(FUN_FIRST):
        an.f["tool_mode"] = "json"
    elif in_json(ARG_FIRST):
        an.f["tool_mode"] = "tag_json"
    else:
        an.f["tool_mode"] = "tag_tagged"
    clean = hay
    rs, re_ = an.get("reasoning_start"), an.get("reasoning_end")
    if rs and rs in clean:
        p = clean.find(rs)
        clean = clean[:p] + clean[p + len(rs) :]
    if re_ and re_ in clean:
        p = clean.find(re_)
        clean = clean[:p] + clean[p + len(re_) :]
    if an.f["tool_mode"] == "json":
        _json_native(an, clean)
        if parallel:
            _json_parallel(an)
    else:
        _non_json(an, clean)
    an.f["section_end"] = trim(an.get("section_end"))
    an.f["call_end"] = trim(an.get("call_end"))


def _json_native(an: Analysis, clean: str) -> None:
    start, end = clean.find("{"), clean.rfind("}")
    cut = clean[start : end + 1]
    try:
        obj = json.loads(cut)
    except ValueError:
        return
    if not isinstance(obj, dict):
        return

    def register(prefix: str, key: str, value: Any) -> None:
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, str) and "call0000" in value:
            an.f["id_field"] = name
        elif isinstance(value, str) and value == FUN_FIRST:
            an.f["name_field"] = name
        elif ARG_FIRST in _dump(value):
            an.f["args_field"] = name
        elif "id" in key:
            an.f["gen_id_field"] = name

    for key, value in obj.items():
        if key == FUN_FIRST:
            an.f.update(fun_name_is_key=True, name_field="", args_field="")
            continue
        if isinstance(value, dict) and ARG_FIRST not in _dump(value):
            an.f["function_field"] = key
            for k2, v2 in value.items():
                register(key, k2, v2)
        register("", key, value)
    r = Tagged(rf"(?P<pre>\[{SPACE}){lit(cut)}(?P<post>{SPACE}\])").search(clean)
    if r:
        an.f["array_wrapped"] = True
        start -= len(r["pre"])
        end += len(r["post"])
    end += 1
    located = []
    for key in ("name_field", "args_field", "id_field", "gen_id_field"):
        if an.get(key):
            located.append((clean.find(an.get(key)), an.get(key)))
    an.f["parameter_order"] = tuple(n for _, n in sorted(located))
    an.f["section_start"] = trim_leading(clean[:start])
    an.f["section_end"] = trim(clean[end:])
    if an.get("array_wrapped") and an.get("section_end") == "]":
        an.f["section_end"] = ""


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _json_parallel(an: Analysis) -> None:
    c = an.compare([USER, _calls(CALL_1)], [USER, _calls(CALL_1, CALL_2)], TOOLS)
    if c is None:
        return
    start = an.get("section_start")
    if start and start in c.diff.right:
        an.f.update(
            call_start=start, call_end=an.get("section_end"), section_start="", section_end=""
        )


def _non_json(an: Analysis, clean: str) -> None:
    fun = lit(FUN_FIRST)
    r = Tagged(
        rf"(?P<fun_marker>(?:(?P<fun_pre><{until_one_of('>', FUN_FIRST)}){fun}"
        rf"(?P<fun_post>(?!{SPACE}<){until('>')}>){SPACE})"
        rf"|(?:(?P<fun_pre2>\[{until_one_of(']', FUN_FIRST)}){fun}"
        rf"(?P<fun_post2>(?!{SPACE}\[{until(']')}\]){SPACE})))"
    ).search(clean)
    fun_marker = r["fun_marker"] if r else FUN_FIRST
    fun_pre = (r["fun_pre"] or r["fun_pre2"]) if r else ""
    fm = lit(fun_marker)
    per_tool = Tagged(
        rf"(?P<sec_start>{MARKER}{SPACE})(?P<call_start>{MARKER}{SPACE})"
        rf"(?P<fun_pre>{until(fun_marker)}){fm}(?P<rest>.*)"
    ).search(clean)
    if per_tool:
        res = per_tool
        end = Tagged(rf"(?P<call_end>{MARKER}{SPACE})(?P<sec_end>{MARKER}{SPACE})\Z").search(
            per_tool["rest"]
        )
        an.f["name_prefix"] = fun_pre + an.get("name_prefix")
    else:
        res = Tagged(rf"(?P<sec_start>{MARKER}{SPACE}){fm}(?P<rest>.*)").search(clean) or {}
        end = Tagged(rf"(?P<sec_end>{MARKER}{SPACE})\Z").search(res.get("rest", ""))
    end = end or {}
    an.f["call_start"] = res.get("call_start", "")
    an.f["call_end"] = end.get("call_end", "")
    an.f["section_start"] = res.get("sec_start", "")
    an.f["section_end"] = end.get("sec_end", "")


def per_call_markers(an: Analysis) -> None:
    """Whether each call repeats the section markers (then they are per-call markers)."""
    c = an.compare([USER, _calls(CALL_1)], [USER, _calls(CALL_1, CALL_2)], TOOLS)
    if c is None:
        return
    second = trim_leading(diff_split(c.diff.suffix, c.diff.right).right)
    start = an.get("section_start")
    if start and second.startswith(start):
        an.f.update(
            call_start=start, call_end=an.get("section_end"), section_start="", section_end=""
        )
    end = an.get("call_end")
    if end:
        n1, n2 = c.a.count(end), c.b.count(end)
        if n1 > 0 and n1 == n2:
            an.f.update(section_end=end, call_end="")
