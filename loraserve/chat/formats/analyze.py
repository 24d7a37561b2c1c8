"""The differential analyser: a template's `ChatFormat` found by rendering it with sentinel
conversations and reading the markers around the sentinels (a port of llama.cpp's
common/chat-diff-analyzer.cpp, same sentinels, same comparisons, same patches).

Each step renders two conversations that differ in one thing (with and without reasoning,
one tool call and two, one argument and another...) and reads the markers from the
difference (`diff.diff_split`). A render the template refuses skips that step, as in
llama.cpp. `analyze(render, source)` runs the steps in llama.cpp's order and then its
per-template patches (`patches.py`). The steps on reasoning and content are here, the
tool-call steps in `analyze_tools` and `analyze_calls`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loraserve.chat.formats.diff import (
    MARKER,
    SPACE,
    DiffSplit,
    Tagged,
    diff_split,
    lit,
    prune_whitespace,
    segmentize,
    trim,
)

Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool, bool], str]
"""(messages, tools, add_generation_prompt, enable_thinking) -> the rendered prompt; raises
when the template refuses."""

FUN_FIRST, FUN_SECOND = "FFF_FIRST_FUN_F", "SSS_SECOND_FUN_S"
ARG_FIRST, ARG_SECOND = "AA_ARG_FST_AA", "BB_ARG_SND_BB"
USER_MSG, USER_MSG_TWO = "U_USER_MSG Hello END_U", "V_USER_MSG Hello END_V"
ASSISTANT_MSG = "A_ASST_MSG I can help END_A"
THINKING = "REASON_PART I am thinking END_R"
ID1, ID2, ID9 = "call00001", "call00002", "call99999"

_PARAMS = {
    "type": "object",
    "properties": {
        ARG_FIRST: {"type": "string", "description": "First argument"},
        ARG_SECOND: {"type": "string", "description": "Second argument"},
    },
    "required": [],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": n, "description": d, "parameters": _PARAMS},
    }
    for n, d in ((FUN_FIRST, "Test function foo"), (FUN_SECOND, "Test function bar"))
]
USER = {"role": "user", "content": USER_MSG}


def _call(name: str, args: dict[str, Any], id_: str = ID1) -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CALL_1 = _call(FUN_FIRST, {ARG_FIRST: "XXXX", ARG_SECOND: "YYYY"})
CALL_2 = _call(FUN_SECOND, {ARG_FIRST: "XXXX", ARG_SECOND: "YYYY"}, ID2)


def _asst(content: Any = ASSISTANT_MSG, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def _calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return _asst("", tool_calls=list(calls))


@dataclass
class Comparison:
    """Two renders and their difference."""

    diff: DiffSplit
    a: str
    b: str


@dataclass
class Analysis:
    """The analyser's working state (llama.cpp's autoparser), turned into a ChatFormat."""

    render: Render
    source: str
    f: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        """A field of the format being built."""
        return self.f.get(key, _DEFAULTS[key])

    def compare(
        self,
        a: list[dict[str, Any]],
        b: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        gen: bool = False,
        thinking: bool = True,
        thinking_b: bool | None = None,
    ) -> Comparison | None:
        """Render `a` and `b` (default `a`) and diff them; None when a render fails."""
        try:
            out_a = self.render(a, tools, gen, thinking)
            out_b = self.render(
                b if b is not None else a,
                tools,
                gen,
                thinking if thinking_b is None else thinking_b,
            )
        except Exception:  # noqa: BLE001 - a template refusing a sentinel skips the step
            return None
        return Comparison(diff_split(out_a, out_b), out_a, out_b)


_DEFAULTS: dict[str, Any] = {
    "reasoning_mode": "none", "reasoning_start": "", "reasoning_end": "",
    "content_start": "", "content_end": "", "tool_mode": "none",
    "section_start": "", "section_end": "", "call_start": "", "call_end": "",
    "name_field": "name", "args_field": "arguments", "id_field": "", "gen_id_field": "",
    "function_field": "function", "fun_name_is_key": False, "array_wrapped": False,
    "parameter_order": (), "name_prefix": "", "name_suffix": "", "args_separator": "",
    "call_close": "", "args_start": "", "args_end": "", "arg_name_prefix": "",
    "arg_name_suffix": "", "arg_value_prefix": "", "arg_value_suffix": "",
    "arg_separator": "", "id_position": "none", "id_prefix": "", "id_suffix": "",
}  # fmt: skip


# --- reasoning ---------------------------------------------------------------------------


def reasoning_presence(an: Analysis) -> None:
    """Markers around reasoning_content in a rendered assistant turn."""
    c = an.compare([USER, _asst()], [USER, _asst(reasoning_content=THINKING)])
    if c is None or THINKING not in c.diff.right:
        return
    wrapped = Tagged(rf"(?P<pre>{MARKER}{SPACE}){lit(THINKING)}(?P<post>{SPACE}{MARKER}{SPACE})")
    delim = Tagged(rf"{lit(THINKING)}{SPACE}(?:(?P<post>{MARKER}{SPACE}))?")
    r = wrapped.search(c.b) or delim.search(c.b)
    if r is None:
        return
    if r.get("pre") and r["post"]:
        an.f.update(reasoning_mode="tag", reasoning_start=r["pre"], reasoning_end=r["post"])
    elif r["post"]:
        an.f.update(reasoning_mode="tag", reasoning_end=r["post"])


def thinking_enabled(an: Analysis) -> None:
    """Markers the generation prompt gains or loses with enable_thinking."""
    c = an.compare([USER], gen=True, thinking=False, thinking_b=True)
    if c is None:
        return
    d = c.diff
    lt, rt = trim(d.left), trim(d.right)
    if not lt and d.right:
        if rt and c.b.endswith(rt) and not an.get("reasoning_start"):
            an.f.update(reasoning_start=d.right, reasoning_mode="tag")
    elif not rt and d.left:
        if lt and c.a.endswith(lt) and not an.get("reasoning_end"):
            seg = prune_whitespace(segmentize(c.a))
            if len(seg) >= 2 and seg[-1].value == lt and seg[-2].marker:
                an.f["reasoning_start"] = seg[-2].value
            an.f.update(reasoning_end=d.left, reasoning_mode="tag")
    elif lt and rt:
        for base, ext in ((c.b, c.a), (c.a, c.b)):
            n = min(len(base), 64)
            anchor = base[len(base) - n :]
            pos = ext.rfind(anchor)
            if pos < 0 or pos + n >= len(ext):
                continue
            extra = trim(ext[pos + n :])
            if not extra:
                continue
            seg = prune_whitespace(segmentize(extra))
            if len(seg) == 2 and seg[0].marker and seg[1].marker:
                if not an.get("reasoning_start"):
                    an.f["reasoning_start"] = seg[0].value
                if not an.get("reasoning_end"):
                    an.f["reasoning_end"] = seg[1].value
                an.f["reasoning_mode"] = "tag"
                break
    if an.get("reasoning_mode") == "none" and an.get("reasoning_end"):
        an.f["reasoning_mode"] = "tag"


def reasoning_scope(an: Analysis) -> None:
    """Reasoning rendered only on turns with tool calls (TOOLS_ONLY)."""
    with_tools = _asst(
        None,
        reasoning_content=THINKING,
        tool_calls=[_call(FUN_FIRST, {ARG_FIRST: "VVVV", ARG_SECOND: "XXXX"})],
    )
    c = an.compare([USER, _asst(reasoning_content=THINKING)], [USER, with_tools], TOOLS)
    if c is None or THINKING in c.a or THINKING not in c.b:
        return
    an.f["reasoning_mode"] = "tools_only"
    r = Tagged(rf"(?P<pre>{MARKER}{SPACE}){lit(THINKING)}{SPACE}(?P<post>{MARKER}{SPACE})").search(
        c.b
    )
    if r:
        an.f.update(reasoning_start=r["pre"], reasoning_end=r["post"])
        return
    r = Tagged(rf"{lit(THINKING)}{SPACE}(?:(?P<post>{MARKER}{SPACE}))?").search(c.b)
    if r:
        an.f["reasoning_end"] = r["post"]
    else:
        an.f["reasoning_mode"] = "none"


# --- content -----------------------------------------------------------------------------


def content_markers(an: Analysis) -> None:
    """Markers around an assistant's content (Command R+ style), if any."""
    base = [USER, _asst()]
    ct = an.compare(base, [USER, _calls(_call("test_func", {"arg1": "value1"}))], TOOLS)
    cr = an.compare(base, [USER, _asst("", reasoning_content=THINKING)], TOOLS)
    if ct is None or cr is None:
        return
    dt, dr = ct.diff, cr.diff
    plain = False
    if trim(dt.left) == ASSISTANT_MSG:
        if Tagged(rf"{SPACE}{lit(dr.left)}{SPACE}(?:{MARKER})?{SPACE}\Z").match(dr.left):
            plain = True
        elif an.get("reasoning_mode") != "none" and an.get("reasoning_end"):
            if Tagged(rf"{lit(an.get('reasoning_end'))}{SPACE}{lit(ASSISTANT_MSG)}").search(
                dr.left
            ):
                plain = True
    if not plain:
        rdiff = dr.left
        end = an.get("reasoning_end")
        if end and end in rdiff:
            rdiff = rdiff[rdiff.find(end) + len(end) :]
        pure = rdiff if len(rdiff) > len(dt.left) else dt.left
        r = Tagged(
            rf"(?P<pre>{MARKER}{SPACE}){lit(ASSISTANT_MSG)}{SPACE}(?P<post>{MARKER}{SPACE})"
        ).search(pure)
        if r:
            an.f.update(content_start=r["pre"], content_end=r["post"])
    if an.get("content_start") or an.get("content_end"):
        an.f["content_mode"] = "wrapped"
