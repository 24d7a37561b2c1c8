"""What the tool-call scanners share: a scanned call, the scan's result, and markers matched
with the whitespace around them optional (a model often drops the newline a template
writes); `Need` when the text ends before a marker is decided."""

from __future__ import annotations

from dataclasses import dataclass, field

from loraserve.chat.formats.scan import Invalid, skip_ws


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


class Need(Exception):
    """The text ends before this can be decided."""


def lit(text: str, i: int, marker: str) -> int:
    """Past `marker` (whitespace around it optional) at `i`; Need / Invalid otherwise."""
    m = marker.strip()
    if not m:
        return i
    j = skip_ws(text, i)
    if text.startswith(m, j):
        return j + len(m)
    if m.startswith(text[j:]):
        raise Need
    raise Invalid


def opt(text: str, i: int, marker: str) -> int:
    try:
        return lit(text, i, marker)
    except Invalid:
        return i


def until(text: str, i: int, *stops: str) -> int:
    """The first position of any of `stops` (trimmed, non-empty) from `i`; Need if none."""
    found = [text.find(s.strip(), i) for s in stops if s.strip()]
    found = [f for f in found if f >= 0]
    if not found:
        raise Need
    return min(found)
