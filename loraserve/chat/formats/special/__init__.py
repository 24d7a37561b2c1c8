"""Parsers of the formats whose answers the `ChatFormat` fields cannot describe, one module
each (llama.cpp's common/parsers/*.cpp), chosen by the format's `dialect`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial as bind
from typing import Any

from loraserve.chat.formats.harmony import parse_harmony
from loraserve.chat.formats.special import (
    cohere2,
    dsml,
    functionary,
    gemma4,
    kimi_k3,
    lfm2,
    ling3,
    minimax_m3,
    muse,
)
from loraserve.chat.formats.special.text import Parsed

log = logging.getLogger(__name__)
Calls = list[tuple[str, str, str]]
_Parse = Callable[[str, bool, dict | None, bool], Parsed]


def _harmony(text: str, partial: bool, schemas: dict | None, extract: bool) -> Parsed:
    content, reasoning, calls = parse_harmony(text, partial, schemas is not None, extract)
    return Parsed(content, reasoning, [[n, a, ""] for n, a in calls if a or not partial])


DIALECTS: dict[str, _Parse] = {
    "harmony": _harmony,
    "gemma_4": gemma4.parse,
    "deepseek_v3_2": bind(dsml.parse, v4=False),
    "deepseek_v4": bind(dsml.parse, v4=True),
    "lfm2": bind(lfm2.parse, think=True),
    "lfm2_plain": bind(lfm2.parse, think=False),
    "minimax_m3": minimax_m3.parse,
    "ling_3": ling3.parse,
    "kimi_k3": kimi_k3.parse,
    "cohere2_moe": cohere2.parse,
    "functionary_v3_2": functionary.parse,
    "muse_glimmer": muse.parse,
}


def parse_dialect(
    dialect: str, text: str, partial: bool, schemas: dict[str, Any] | None, extract: bool
) -> tuple[str, str, Calls]:
    """(content, reasoning, calls as (name, arguments JSON, id)) of `text` in `dialect`;
    `schemas`: the tools' parameter schemas by name, None when calls are not parsed;
    `extract`: reasoning goes to its own field (else it stays in the content)."""
    try:
        got = DIALECTS[dialect](text, partial, schemas, extract)
    except (ValueError, IndexError, KeyError, TypeError) as exc:  # never a 500 for odd text
        log.warning("chat format %s: unparsable answer (%s); kept as content", dialect, exc)
        return ("" if partial else text), "", []
    return got.content, got.reasoning, [(n, a, i) for n, a, i in got.calls]
