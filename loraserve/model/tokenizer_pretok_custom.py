"""llama.cpp's hand-written pre-tokenizer steps (unicode.cpp), for the regexes it does not run.

llama.cpp recognises a few regex strings and splits with its own code instead: Kimi K2's whole
split (`\\p{Han}+`, unicode_regex_split_custom_kimi_k2), AFMoE's digit groups (also used for
tiny_aya's `\\d{1,3}(?=(?:\\d{3})*\\b)`), and SuperBPE's zero-width `(?=(\\d{3})+(?!\\d))` that
std::regex runs. Each step takes one piece and returns its pieces; categories are llama.cpp's own
(`tokenizer_unicode.flags_table`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from loraserve.model.tokenizer_unicode import (
    LETTER,
    NUMBER,
    UNDEFINED,
    WHITESPACE,
    code_points,
    flags_table,
)

_HAN = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF),
        (0x2F800, 0x2FA1F)]  # fmt: skip
_OUT = -1  # a position outside the piece


def _is_han(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _HAN)


def _lower(cp: int) -> int:
    return cp + 32 if 0x41 <= cp <= 0x5A else cp


def kimi_k2(piece: str) -> list[str]:
    """unicode_regex_split_custom_kimi_k2 over one piece."""
    cps = code_points(piece).tolist()
    table = flags_table()
    flags = [int(table[c]) for c in cps]
    n = len(cps)

    def cpt(i: int) -> int:
        return cps[i] if 0 <= i < n else _OUT

    def flag(i: int) -> int:
        return flags[i] if 0 <= i < n else 0

    def letter(i: int) -> bool:
        return bool(flag(i) & LETTER) and not _is_han(cpt(i))

    def space(i: int) -> bool:
        return cpt(i) in WHITESPACE

    out: list[str] = []
    prev = 0

    def add(end: int) -> None:
        nonlocal prev
        if end > prev:
            out.append(piece[prev:end])
        prev = end

    pos = 0
    while pos < n:
        cp, fl = cps[pos], flags[pos]
        if _is_han(cp):
            while 0 <= pos < n and _is_han(cps[pos]):
                pos += 1
            add(pos)
            continue
        plain = not (cp in (13, 10) or fl & (LETTER | NUMBER))
        if (fl & LETTER and not _is_han(cp)) or (plain and letter(pos + 1)):
            leading = False
            if plain:
                leading = True
                pos += 1
            letters = False
            while letter(pos):
                letters = True
                pos += 1
            if letters or (not leading and letter(pos)):
                if not letters:
                    pos += 1
                while letter(pos):
                    pos += 1
                if cpt(pos) == 0x27 and pos + 1 < n:
                    nxt = _lower(cpt(pos + 1))
                    if nxt in (0x73, 0x74, 0x6D, 0x64):  # s t m d
                        pos += 2
                    elif pos + 2 < n:
                        nxt2 = _lower(cpt(pos + 2))
                        if (nxt, nxt2) in ((0x72, 0x65), (0x76, 0x65), (0x6C, 0x6C)):  # re ve ll
                            pos += 3
                add(pos)
                continue
            if leading:
                pos -= 1
        if fl & NUMBER:
            start = pos
            while flag(pos) & NUMBER:
                pos += 1
                if pos - start >= 3:
                    add(pos)
                    start = pos
            add(pos)
            continue
        nxt_fl, nxt_space = (flag(pos + 1), space(pos + 1)) if cp == 0x20 else (fl, space(pos))
        if not (nxt_space or nxt_fl & (LETTER | NUMBER)) and nxt_fl:
            pos += cp == 0x20
            while not (space(pos) or flag(pos) & (LETTER | NUMBER)) and flag(pos):
                pos += 1
            while cpt(pos) in (13, 10):
                pos += 1
            add(pos)
            continue
        count, last_newline = 0, 0
        while space(pos + count):
            if cpt(pos + count) in (13, 10):
                last_newline = pos + count + 1
            count += 1
        if last_newline > 0:
            pos = last_newline
        elif count > 1 and cpt(pos + count) != _OUT:
            pos += count - 1
        elif count > 0:
            pos += count
        else:
            pos += 1
        add(pos)
    return out


def digit_groups(piece: str) -> list[str]:
    """unicode_regex_split_custom_afmoe: each run of numbers as a group of its length modulo 3
    (if not 0) then groups of 3; the text before a run joins its first group."""
    cps = code_points(piece)
    numbers = (flags_table()[cps] & NUMBER) != 0
    out: list[str] = []
    prev, pos, n = 0, 0, len(piece)
    while pos < n:
        if not numbers[pos]:
            pos += 1
            continue
        start = pos
        while pos < n and numbers[pos]:
            pos += 1
        cut = start + (pos - start) % 3
        for end in ([cut] if cut > start else []) + list(range(cut + 3, pos + 1, 3)):
            out.append(piece[prev:end])
            prev = end
    if prev < n:
        out.append(piece[prev:])
    return out


_ZERO_WIDTH = re.compile(r"(?=(\d{3})+(?!\d))", re.ASCII)


def thousands(piece: str) -> list[str]:
    """std::regex's split at each zero-width match of (?=(\\d{3})+(?!\\d)) (ASCII digits)."""
    cuts = [m.start() for m in _ZERO_WIDTH.finditer(piece)]
    bounds = [0, *[c for c in cuts if 0 < c < len(piece)], len(piece)]
    return [piece[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


# llama.cpp's regex strings it splits with its own code -> that code
CUSTOM_STEPS: dict[str, Callable[[str], list[str]]] = {
    r"\p{Han}+": kimi_k2,
    r"\p{AFMoE_digits}": digit_groups,
    r"\d{1,3}(?=(?:\d{3})*\b)": digit_groups,
    r"(?=(\d{3})+(?!\d))": thousands,
}
assert UNDEFINED  # flags of code points llama.cpp does not know count as "something" (non-zero)
