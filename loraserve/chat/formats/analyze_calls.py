"""The differential analyser, second half: inside one tool call, the function name's
markers, the arguments' markers (tagged names and values, separators, the arguments block)
and where a call id sits (llama.cpp common/chat-diff-analyzer.cpp, `analyze_tools::extract_*`).
"""

from __future__ import annotations

from loraserve.chat.formats.analyze import (
    ARG_FIRST,
    ARG_SECOND,
    CALL_1,
    CALL_2,
    FUN_FIRST,
    ID1,
    ID9,
    TOOLS,
    USER,
    Analysis,
    _asst,
    _call,
    _calls,
)
from loraserve.chat.formats.diff import (
    MARKER,
    NOT_MARKER_RUN,
    SPACE,
    Tagged,
    after_common_suffix,
    first_marker,
    last_marker,
    last_marker_to_end,
    lit,
    trim,
    trim_leading,
    until,
    until_common_prefix,
    until_one_of,
)

ONE_ARG = _call(FUN_FIRST, {ARG_FIRST: "XXXX"})
ONE_ARG_Y = _call(FUN_FIRST, {ARG_FIRST: "YYYY"})
OTHER_ARG = _call(FUN_FIRST, {ARG_SECOND: "YYYY"})
ZERO_ARGS = _call(FUN_FIRST, {})
ALT_ID = _call(FUN_FIRST, {ARG_FIRST: "XXXX", ARG_SECOND: "YYYY"}, ID9)


def _cmp(an: Analysis, a: dict, b: dict):  # noqa: ANN202 - Comparison | None
    return an.compare([USER, _calls(a)], [USER, _calls(b)], TOOLS)


def function_markers(an: Analysis) -> None:
    """The function name's prefix and suffix, the name/arguments separator, the closer."""
    c = _cmp(an, CALL_1, CALL_2)
    if c is None:
        return
    d = c.diff
    if FUN_FIRST not in d.left or "SSS_SECOND_FUN_S" not in d.right:
        return
    mode = an.get("tool_mode")
    pre_marker = an.get("call_start") or an.get("section_start")
    if pre_marker and d.prefix.rfind(pre_marker) >= 0:
        an.f["name_prefix"] = d.prefix[d.prefix.rfind(pre_marker) + len(pre_marker) :]
    r = Tagged(rf"(?P<pre>{until(FUN_FIRST)}){lit(FUN_FIRST)}(?P<post>{NOT_MARKER_RUN})").match(
        d.left
    )
    if r:
        an.f["name_prefix"] = an.get("name_prefix") + r["pre"]
        an.f["name_suffix"] = r["post"]
    if mode == "tag_json":
        non_json = rf"(?:{MARKER}|(?!\{{)(?!\[).)"
        r = Tagged(rf"(?P<ext>{non_json}*+){NOT_MARKER_RUN}{MARKER}").match(d.suffix)
        if r:
            an.f["name_suffix"] += r["ext"]
    else:
        r = Tagged(rf"(?P<ext>{NOT_MARKER_RUN})").match(d.suffix)
        if r:
            an.f["name_suffix"] += r["ext"]
            arg_start = rf"{MARKER}{SPACE}(?:{lit(ARG_FIRST)}|{lit(ARG_SECOND)})"
            s = Tagged(rf"(?P<sep>(?:(?!{arg_start}).)*+){arg_start}").match(
                d.suffix[len(r["ext"]) :]
            )
            if s:
                an.f["args_separator"] = trim(s["sep"])
    suffix_marker = an.get("call_end") or an.get("section_end")
    closer = ""
    if not suffix_marker:
        n = an.compare([USER, _calls(CALL_1)], [USER, _asst()], TOOLS)
        if n is not None:
            left = n.diff.left
            closer = left[left.find("YYYY") + 4 :] if "YYYY" in left else left[3:]
    else:
        pos = d.suffix.find(suffix_marker)
        closer = d.suffix[:pos] if pos >= 0 else d.suffix
    if closer:
        if mode == "tag_tagged":
            r = Tagged(rf"{until('YYYY')}YYYY{SPACE}{MARKER}{SPACE}(?P<close>.*)").match(closer)
            if r:
                an.f["call_close"] = r["close"]
        elif mode == "tag_json":
            r = Tagged(rf"{until('YYYY')}YYYY(?P<post>.*)").match(closer)
            if r:
                post = r["post"]
                pos = max(post.rfind("}"), post.rfind("]"))
                if 0 <= pos < len(post) - 1:
                    an.f["call_close"] = trim_leading(post[pos + 1 :])
    an.f["call_close"] = trim_leading(an.get("call_close"))


def argument_markers(an: Analysis) -> None:
    """tag_tagged: the markers around each argument's name and value."""
    c = _cmp(an, ONE_ARG, OTHER_ARG)
    if c is not None and c.diff.left and c.diff.right:
        d = c.diff
        lr = Tagged(
            rf"(?P<pre>{until(ARG_FIRST)}){lit(ARG_FIRST)}(?P<suffix>{until_one_of(chr(34), 'X')})"
        ).search(d.left)  # noqa: E501
        sfx = until_one_of(chr(34), "Y")
        rr = Tagged(rf"(?P<pre>{until(ARG_SECOND)}){lit(ARG_SECOND)}(?P<suffix>{sfx})").search(
            d.right
        )
        if lr and rr and lr["pre"] and lr["pre"] == rr["pre"] and lr["suffix"] == rr["suffix"]:
            an.f.update(arg_name_prefix=lr["pre"], arg_name_suffix=lr["suffix"])
        elif d.left.startswith(ARG_FIRST) and d.right.startswith(ARG_SECOND):
            m = last_marker_to_end(d.prefix)
            an.f["arg_name_prefix"] = m if m is not None else d.prefix
            after = d.left[len(ARG_FIRST) :] + d.suffix
            s = Tagged(rf"(?P<suffix>{NOT_MARKER_RUN}{MARKER}{SPACE})").search(after)
            if s:
                an.f["arg_name_suffix"] = s["suffix"]
    c = _cmp(an, ONE_ARG, ONE_ARG_Y)
    if c is None or c.diff.left != "XXXX" or c.diff.right != "YYYY":
        return
    d = c.diff
    ending = ARG_FIRST + an.get("arg_name_suffix")
    prefix = d.prefix
    if prefix.rfind(ending) >= 0:
        prefix = prefix[prefix.rfind(ending) + len(ending) :]
    if prefix:
        m = last_marker_to_end(prefix)
        an.f["arg_value_prefix"] = m if m is not None else prefix
    vs = d.suffix
    close = an.get("call_close")
    end_marker = an.get("call_end") or an.get("section_end")
    if close:
        if close in vs:
            vs = vs[: vs.find(close)]
    elif end_marker and end_marker in vs:
        vs = vs[: vs.find(end_marker)]
    if trim(vs):
        an.f["arg_value_suffix"] = vs


def argument_separator(an: Analysis) -> None:
    """What separates two arguments."""
    c = _cmp(an, ONE_ARG, CALL_1)
    if c is not None and c.diff.right:
        an.f["arg_separator"] = until_common_prefix(c.diff.right, ARG_FIRST, ARG_SECOND)


def args_markers(an: Analysis) -> None:
    """json mode: markers around the arguments object inside the call object."""
    c = _cmp(an, ZERO_ARGS, ONE_ARG)
    if c is None or an.get("tool_mode") != "json":
        return
    d = c.diff
    pm = an.get("section_start") or an.get("call_start")
    sm = an.get("section_end") or an.get("call_end")
    pp = d.prefix.rfind(pm) if pm else 0
    sp = d.suffix.find(sm) if sm else len(d.suffix)
    pp = 0 if pp < 0 else pp
    sp = len(d.suffix) if sp < 0 else sp
    start = until_common_prefix(d.prefix[pp + len(pm) :], "{}", '{"first":')
    end = after_common_suffix(d.suffix[:sp], "{}", '"XXXX"}')
    if start or end:
        if FUN_FIRST in start:
            start = start[start.find(FUN_FIRST) + len(FUN_FIRST) :]
        if ID1 in start:
            start = start[start.find(ID1) + len(ID1) :]
        an.f.update(args_start=start, args_end=end)


def call_id_markers(an: Analysis) -> None:
    """Where a model-written call id sits, and its markers."""
    c = _cmp(an, CALL_1, ALT_ID)
    if c is None or (not c.diff.left and not c.diff.right):
        return
    d = c.diff
    n = 0
    while n < min(len(ID1), len(ID9)) and ID1[n] == ID9[n]:
        n += 1
    common = ID1[:n]
    in_pre, in_suf = d.prefix.rfind(FUN_FIRST), d.suffix.find(FUN_FIRST)
    if in_pre >= 0 and in_suf < 0:
        args_pre, args_suf = d.prefix.find("{", in_pre), d.suffix.find("{")
        if args_suf >= 0 and args_pre < 0:
            an.f["id_position"] = "between_name_and_args"
            after = d.prefix[in_pre + len(FUN_FIRST) :]
            r = Tagged(
                rf"(?P<prefix>{MARKER})(?:(?!{MARKER})(?!{lit(common)}).)*+{lit(common)}"
            ).search(after)
            an.f["id_prefix"] = r["prefix"] if r else last_marker(after)
            s = Tagged(rf"(?:(?!{MARKER})(?!\{{).)*+(?P<suffix>{MARKER})").search(d.suffix)
            if s:
                an.f["id_suffix"] = s["suffix"]
        elif args_pre >= 0:
            an.f["id_position"] = "post_args"
            after = d.prefix[args_pre:]
            brace = after.rfind("}")
            if brace >= 0:
                an.f["id_prefix"] = last_marker(after[brace + 1 :])
            an.f["id_suffix"] = first_marker(d.suffix)
    elif in_suf >= 0 and in_pre < 0:
        an.f["id_position"] = "pre_name"
        an.f["id_prefix"] = last_marker(d.prefix)
        an.f["id_suffix"] = first_marker(d.suffix[:in_suf])
    if an.get("id_prefix") == an.get("args_end"):
        an.f["id_prefix"] = ""
    if an.get("id_suffix") == an.get("args_start"):
        an.f["id_suffix"] = ""
    suf = an.get("id_suffix")
    if an.get("id_position") != "none" and suf and an.get("call_end").startswith(suf):
        an.f["call_end"] = ""
