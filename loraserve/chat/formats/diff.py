"""Text helpers of the differential analysis (llama.cpp common/chat-auto-parser-helpers.cpp):
split a rendered prompt into markers (`<...>`, `[...]`) and text, and the difference of two
renders as prefix / left / right / suffix, computed over those segments so a diff never cuts
a marker in two.

`Tagged` is the small part of llama.cpp's PEG builder the analysis uses (`marker`, `space`,
`until`, `rest`, named captures), written as Python regular expressions with possessive
quantifiers, which match as PEG's greedy, non-backtracking repetitions do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WS = " \t\n\r\f\v"
MARKER = r"(?:<[^>]*+>|\[[^\]]*+\])"
SPACE = r"[ \t\n\r]*+"


def trim(s: str) -> str:
    """`s` without leading and trailing whitespace."""
    return s.strip(WS)


def trim_leading(s: str) -> str:
    """`s` without leading whitespace."""
    return s.lstrip(WS)


@dataclass(frozen=True)
class Segment:
    """A marker (`<...>` or `[...]`) or the text between markers."""

    marker: bool
    value: str


def segmentize(text: str) -> list[Segment]:
    """`text` as alternating text and marker segments (llama.cpp's segmentize_markers)."""
    out: list[Segment] = []
    opener = ""
    border = 0
    for i, c in enumerate(text):
        if not opener and c in "<[":
            if border < i:
                out.append(Segment(False, text[border:i]))
            border, opener = i, c
        elif opener and c == (">" if opener == "<" else "]"):
            out.append(Segment(True, text[border : i + 1]))
            border, opener = i + 1, ""
    if border < len(text):
        out.append(Segment(False, text[border:]))
    return out


def prune_whitespace(segments: list[Segment]) -> list[Segment]:
    """The segments that are not whitespace only."""
    return [s for s in segments if trim(s.value)]


@dataclass(frozen=True)
class DiffSplit:
    """Two texts as `prefix + left + suffix` and `prefix + right + suffix`."""

    prefix: str = ""
    suffix: str = ""
    left: str = ""
    right: str = ""


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _common_suffix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if x != y:
            break
        n += 1
    return n


def diff_split(left: str, right: str) -> DiffSplit:
    """The difference of two renders, segment-aligned (llama.cpp's calculate_diff_split)."""
    ls, rs = segmentize(left), segmentize(right)
    if not ls:
        return DiffSplit(right=right)
    if not rs:
        return DiffSplit(left=left)
    l0, l1, r0, r1 = 0, len(ls) - 1, 0, len(rs) - 1
    prefix, suffix = "", ""
    l_done = r_done = False
    while l0 != l1 and r0 != r1:
        advanced = False
        if ls[l0] == rs[r0]:
            prefix += ls[l0].value
            l0, r0 = l0 + 1, r0 + 1
            advanced = True
        if ls[l1] == rs[r1]:
            suffix = ls[l1].value + suffix
            if l0 != l1:
                l1 -= 1
            else:
                l_done = True
            if r0 != r1:
                r1 -= 1
            else:
                r_done = True
            advanced = True
        if not advanced:
            break
    if l0 == l1 and r0 != r1:
        if ls[l0] == rs[r1]:
            suffix = rs[r1].value + suffix
            r1 -= 1
            l_done = True
        elif ls[l0] == rs[r0]:
            prefix += rs[r0].value
            r0 += 1
            l_done = True
    elif r0 == r1 and l0 != l1:
        if ls[l1] == rs[r0]:
            suffix = ls[l1].value + suffix
            l1 -= 1
            r_done = True
        elif ls[l0] == rs[r0]:
            prefix += ls[l0].value
            l0 += 1
            r_done = True
    elif l0 == l1 and r0 == r1 and ls[l0] == rs[r0] and ls[l0].marker:
        prefix += rs[r0].value
        l_done = r_done = True
    text_suffix = not ls[l1].marker and not rs[r1].marker
    text_prefix = not rs[r0].marker and not ls[l0].marker
    rem_l = "".join(s.value for s in ls[l0 : (l1 if l_done else l1 + 1)])
    rem_r = "".join(s.value for s in rs[r0 : (r1 if r_done else r1 + 1)])
    n_suf = _common_suffix(rem_l, rem_r) if text_suffix else 0
    n_pre = (
        _common_prefix(rem_l[: len(rem_l) - n_suf], rem_r[: len(rem_r) - n_suf])
        if text_prefix
        else 0
    )
    prefix += rem_l[:n_pre]
    suffix = rem_l[len(rem_l) - n_suf :] + suffix
    d_left = rem_l[n_pre : len(rem_l) - n_suf]
    d_right = rem_r[n_pre : len(rem_r) - n_suf]
    if not d_left and not d_right:
        return DiffSplit(prefix=left)
    if not d_left and d_right and len(left) <= len(right) and right.startswith(left):
        return DiffSplit(prefix=left, right=right[len(left) :])
    return DiffSplit(prefix, suffix, d_left, d_right)


def until_common_prefix(full: str, left: str, right: str) -> str:
    """`full` up to the first occurrence of the common prefix of `left` and `right`."""
    n = _common_prefix(left, right)
    pos = full.find(left[:n]) if n else -1
    return full[:pos] if pos >= 0 else ""


def after_common_suffix(full: str, left: str, right: str) -> str:
    """`full` after the last occurrence of the common suffix of `left` and `right`."""
    n = _common_suffix(left, right)
    pos = full.rfind(left[len(left) - n :]) if n else -1
    return full[pos + n :] if pos >= 0 else ""


class Tagged:
    """A pattern with named captures, matched at the start (`match`) or at the first position
    it matches (`search`, llama.cpp's parse_anywhere_and_extract); captures that did not
    take part come back as ""."""

    def __init__(self, pattern: str) -> None:
        self.rx = re.compile(pattern, re.S)

    def match(self, text: str) -> dict[str, str] | None:
        """The captures when the pattern matches at the start of `text`."""
        m = self.rx.match(text)
        return None if m is None else {k: v or "" for k, v in m.groupdict().items()}

    def search(self, text: str) -> dict[str, str] | None:
        """The captures at the first position of `text` where the pattern matches."""
        m = self.rx.search(text)
        return None if m is None else {k: v or "" for k, v in m.groupdict().items()}


def lit(s: str) -> str:
    """A literal in a `Tagged` pattern."""
    return re.escape(s)


def until(s: str) -> str:
    """Everything up to (not including) `s`, or to the end."""
    return rf"(?:(?!{re.escape(s)}).)*+"


def until_one_of(*ss: str) -> str:
    """Everything up to the first of `ss`, or to the end."""
    alt = "|".join(re.escape(s) for s in ss)
    return rf"(?:(?!{alt}).)*+"


NOT_MARKER_RUN = rf"(?:(?!{MARKER}).)*+"
LAST_MARKER = rf"{MARKER}{NOT_MARKER_RUN}\Z"


def last_marker_to_end(text: str) -> str | None:
    """The last marker of `text` with the text after it, or None when it has no marker."""
    r = Tagged(rf"(?:(?!{LAST_MARKER}).)*+(?P<m>{LAST_MARKER})").match(text)
    return r["m"] if r else None


def last_marker(text: str) -> str:
    """Just the last marker of `text`, or ""."""
    found = re.findall(MARKER, text, re.S)
    return found[-1] if found else ""


def first_marker(text: str) -> str:
    """The first marker of `text`, or ""."""
    m = re.search(MARKER, text, re.S)
    return m.group(0) if m else ""
