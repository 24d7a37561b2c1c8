"""Which `ChatFormat` a template gets, as llama-server chooses (common/chat.cpp
`common_chat_try_specialized_template`, then the differential analyser): the specialised
detectors first, each keyed on markers in the template source, in llama.cpp's order; every
other template goes through `autoformat.analyze`.

The specialised families' descriptions live in `special/formats.py` (each of the 15 gets
llama-server's description; those the fields cannot spell name a dialect parser).
"""

from __future__ import annotations

import logging

from loraserve.chat.formats.analyze import Render
from loraserve.chat.formats.autoformat import analyze
from loraserve.chat.formats.description import PLAIN, ChatFormat
from loraserve.chat.formats.special.formats import SPECIALISED

log = logging.getLogger(__name__)

_warned: set[str] = set()


def detect(source: str, render: Render) -> ChatFormat:
    """The format llama-server uses for the template `source` (rendered by `render` for the
    differential analysis). Never raises: a template nothing understands is plain content,
    with one warning per template."""
    for name, test, make in SPECIALISED:
        if test(source):
            fmt = make(source)
            if not fmt.has_tools and name not in _warned:
                _warned.add(name)
                log.warning(
                    "chat format %s: tool calls and reasoning are not parsed yet for this "
                    "template; answers are plain content",
                    name,
                )
            return fmt
    try:
        return analyze(render, source)
    except Exception as exc:  # noqa: BLE001 - an unanalysable template answers plain content
        key = str(hash(source))
        if key not in _warned:
            _warned.add(key)
            log.warning("chat format: the template could not be analysed (%s); plain content", exc)
        return PLAIN
