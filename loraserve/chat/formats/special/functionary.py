"""Functionary v3.2 answers (llama.cpp common/parsers/functionary-v3-2.cpp): messages
`>>>RECIPIENT\\nBODY`, the generation prompt writing the first `>>>`: `all` is content,
any other recipient a call of that function with BODY its JSON arguments."""

from __future__ import annotations

from loraserve.chat.formats.special.text import (
    Invalid,
    Need,
    Parsed,
    json_value,
    opt,
    skip_ws,
    until,
)

SEP, ALL = ">>>", "all\n"


def parse(text: str, partial: bool, schemas: dict | None, extract: bool) -> Parsed:
    """The message in `text` (after the turn's header, from its first `>>>`)."""
    out = Parsed()
    try:
        i = opt(text, 0, SEP, ws=False)
        if text.startswith(ALL, i) or (partial and ALL.startswith(text[i:])):
            if not text.startswith(ALL, i):
                return out
            stops = (SEP,) if schemas is not None else ()
            body, k, _ = until(text, i + len(ALL), stops, partial)
            out.content = body
            if k < 0:
                return out
            i = k + len(SEP)
        if schemas is None:
            return out
        while i < len(text):
            k = text.find("\n", i)
            if k < 0:
                raise Need
            call = out.call(text[i:k].strip())
            start = skip_ws(text, k + 1)
            try:
                value, i = json_value(text, start)
            except Need:
                call[1] = text[start:]
                raise
            call[1] = value
            i = opt(text, skip_ws(text, i), SEP, ws=False)
    except (Need, Invalid):
        pass
    return out
