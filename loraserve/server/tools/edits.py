"""`edit_file`'s replacements, as llama-server applies them (server-tools.cpp,
`server_tool_edit_file`): every `old_text` must occur exactly once in the original content
(not in the result of the previous edits), edits may not overlap, and when an `old_text`
only matches after a light normalisation (trailing blanks, typographic quotes, dashes and
spaces made plain) the edit applies to the normalised lines it touches while the other
lines keep their bytes.
"""

from __future__ import annotations

from loraserve.server.tools.confine import ToolError

_PLAIN = {
    **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
    **dict.fromkeys("\u00a0\u202f\u205f\u3000", " "),
    **dict.fromkeys("".join(chr(c) for c in range(0x2002, 0x200B)), " "),
}
_TABLE = str.maketrans(_PLAIN)


def normalize(content: str) -> str:
    """Each line without trailing spaces, tabs and CRs, its typographic characters plain."""
    return "\n".join(line.rstrip(" \t\r").translate(_TABLE) for line in content.split("\n"))


def _count(content: str, needle: str) -> int:
    count = pos = 0
    while needle and (pos := content.find(needle, pos)) != -1:
        count += 1
        pos += len(needle)
    return count


def _split_nl(content: str) -> list[str]:
    parts = content.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _apply(content: str, matched: list[tuple[int, int, int, str]], offset: int = 0) -> str:
    for _, idx, length, new in reversed(matched):
        local = idx - offset
        content = content[:local] + new + content[local + length :]
    return content


def apply_edits(original: str, edits: list[tuple[str, str]], path: str) -> str:
    """The content after `edits` ((old_text, new_text) pairs); raises `ToolError` with
    llama-server's messages."""
    fuzzy = False
    norm_original = normalize(original)
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if normalize(old) not in norm_original:
            raise ToolError(
                f"could not find edits[{i}].old_text in {path}, it must match the file's "
                "current content exactly"
            )
        fuzzy = True
    base = norm_original if fuzzy else original
    matched = []
    for i, (old, new) in enumerate(edits):
        needle = normalize(old) if fuzzy else old
        occurrences = _count(norm_original, normalize(old))
        if occurrences > 1:
            raise ToolError(
                f"found {occurrences} occurrences of edits[{i}].old_text in {path}, "
                "it must be unique"
            )
        matched.append((i, base.find(needle), len(needle), new))
    matched.sort(key=lambda m: m[1])
    for a, b in zip(matched, matched[1:], strict=False):
        if a[1] + a[2] > b[1]:
            raise ToolError(
                f"edits[{a[0]}] and edits[{b[0]}] overlap in {path}; merge them into one "
                "edit or target disjoint regions"
            )
    if not fuzzy:
        return _apply(base, matched)
    return _apply_keeping_lines(original, base, matched)


def _apply_keeping_lines(original: str, base: str, matched: list[tuple[int, int, int, str]]) -> str:
    """Replacements found in the normalised `base`, applied to the groups of lines they
    touch; the lines between the groups are copied from `original` unchanged."""
    original_lines = _split_nl(original)
    spans, offset = [], 0
    for line in _split_nl(base):
        spans.append((offset, offset + len(line)))
        offset += len(line)
    groups: list[list] = []  # [start_line, end_line (exclusive), replacements]
    for rep in matched:
        start, end = rep[1], rep[1] + rep[2]
        first = next((k for k, (a, b) in enumerate(spans) if a <= start < b), len(spans) - 1)
        last = first
        while last < len(spans) and spans[last][1] < end:
            last += 1
        last = min(last, len(spans) - 1)
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], last + 1)
            groups[-1][2].append(rep)
        else:
            groups.append([first, last + 1, [rep]])
    out, at = [], 0
    for first, end, reps in groups:
        out += original_lines[at:first]
        lo, hi = spans[first][0], spans[end - 1][1]
        out.append(_apply(base[lo:hi], reps, lo))
        at = end
    out += original_lines[at:]
    return "".join(out)
