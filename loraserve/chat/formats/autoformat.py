"""A template's `ChatFormat` by differential analysis (llama.cpp's
`autoparser::analyze_template`): the reasoning, content and tool-call steps of
`analyze.py` / `analyze_calls.py`, the turn markers, the preserved tokens, then llama.cpp's
per-template patches for what the renders cannot show.
"""

from __future__ import annotations

from typing import Any

from loraserve.chat.formats import analyze as A
from loraserve.chat.formats import analyze_calls as C
from loraserve.chat.formats import analyze_tools as T
from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.diff import segmentize, trim
from loraserve.chat.formats.patches import PATCHES


def _caps(an: A.Analysis) -> tuple[bool, bool]:
    """(supports tool calls, supports parallel calls): the template renders an assistant's
    call (its function name shows) and a second call beside it."""
    try:
        one = an.render([A.USER, A._calls(A.CALL_1)], A.TOOLS, False, True)
    except Exception:  # noqa: BLE001 - a template refusing tool calls does not support them
        return False, False
    if A.FUN_FIRST not in one:
        return False, False
    try:
        two = an.render([A.USER, A._calls(A.CALL_1, A.CALL_2)], A.TOOLS, False, True)
    except Exception:  # noqa: BLE001
        return True, False
    return True, A.FUN_SECOND in two


def _assistant_start(an: A.Analysis) -> str:
    c = an.compare([A.USER], [A.USER, A._asst()])
    if c is None:
        return ""
    pre = c.diff.right.split(A.ASSISTANT_MSG)[0]
    for tag in (trim(an.get("reasoning_start")), trim(an.get("reasoning_end"))):
        if tag and tag in pre:
            pre = pre[: pre.find(tag)]
    return trim(pre)


def _user_start(an: A.Analysis) -> str:
    c = an.compare([], [A.USER])
    if c is None:
        two = {"role": "user", "content": A.USER_MSG_TWO}
        c = an.compare([two, A._asst()], [two, A._asst(), A.USER])
        if c is None:
            return ""
    msg = c.diff.right
    if A.ASSISTANT_MSG in msg:
        msg = msg[msg.find(A.ASSISTANT_MSG) + len(A.ASSISTANT_MSG) :]
    out, seen = "", False
    for s in segmentize(msg.split(A.USER_MSG)[0]):
        low = s.value.lower()
        if s.marker and not seen and ("end" in low or "close" in low):
            continue
        if not s.marker and not seen and not trim(s.value):
            continue
        seen |= s.marker
        out += s.value
    return trim(out)


_TOKEN_FIELDS = (
    "reasoning_start", "reasoning_end", "content_start", "content_end", "section_start",
    "section_end", "call_start", "call_end", "name_prefix", "name_suffix", "args_separator",
    "call_close", "args_start", "args_end", "arg_name_prefix", "arg_name_suffix",
    "arg_separator", "arg_value_prefix", "arg_value_suffix", "id_prefix", "id_suffix",
)  # fmt: skip


def _preserved(an: A.Analysis) -> list[str]:
    out: list[str] = []
    for key in _TOKEN_FIELDS:
        t = trim(an.get(key))
        if t and t not in out:
            out.append(t)
    return out


def analyze(render: A.Render, source: str) -> ChatFormat:
    """The format llama-server's differential analyser finds for the template `source`,
    rendered by `render`."""
    an = A.Analysis(render, source)
    supports_calls, parallel = _caps(an)
    A.reasoning_presence(an)
    A.thinking_enabled(an)
    if supports_calls:
        A.reasoning_scope(an)
    A.content_markers(an)
    if supports_calls:
        T.tool_calls(an, parallel)
        if an.get("tool_mode") not in ("none", "json"):
            if parallel:
                T.per_call_markers(an)
            C.function_markers(an)
            if an.get("tool_mode") == "tag_tagged":
                C.argument_markers(an)
            C.argument_separator(an)
            C.args_markers(an)
            C.call_id_markers(an)
    an.f["assistant_start"] = _assistant_start(an)
    an.f["user_start"] = _user_start(an)
    extra: dict[str, Any] = {"preserved_tokens": _preserved(an), "additional_stops": []}
    for patch in PATCHES:
        patch(source, an, extra)
    f = {k: v for k, v in an.f.items() if k != "content_mode"}
    return ChatFormat(
        detector="auto",
        supports_parallel=parallel,
        preserved_tokens=tuple(extra["preserved_tokens"]),
        additional_stops=tuple(extra["additional_stops"]),
        **{k: tuple(v) if isinstance(v, list) else v for k, v in f.items()},
    )
