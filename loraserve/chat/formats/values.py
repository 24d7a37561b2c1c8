"""Tagged argument values as JSON: which types a parameter's schema allows, a raw value
typed by it, and MiniCPM5's CDATA-wrapped strings."""

from __future__ import annotations

import json
from typing import Any

from loraserve.chat.formats.scan import held


def cdata(text: str, v: int, head: str, parts: list[str]) -> int | None:
    """A string value wrapped in `<![CDATA[..]]>` at `v` (MiniCPM5: it may hold the closing
    tag) appended to `parts`: the position after `]]>`, -1 when the text ends inside it,
    -2 when it ends inside the opener, None when the value is not wrapped."""
    if not text.startswith(_CDATA, v):
        return -2 if _CDATA.startswith(text[v:]) else None
    end = text.find("]]>", v + len(_CDATA))
    raw = text[v + len(_CDATA) : end if end >= 0 else len(text)]
    if end < 0:
        raw = raw[: len(raw) - held(raw, ("]]>",))]
        parts.append(head + json.dumps(raw, ensure_ascii=False)[:-1])
        return -1
    parts.append(head + json.dumps(raw, ensure_ascii=False))
    return end + 3


_CDATA = "<![CDATA["


def types_of(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    t = schema.get("type")
    out = set(t) if isinstance(t, list) else ({t} if isinstance(t, str) else set())
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            out |= types_of(sub)
    if "enum" in schema and not out:
        out |= {type(v).__name__ for v in schema["enum"]} & {"str"} and {"string"} or set()
    return out


def is_string(schema: Any) -> bool:
    """Whether a value of this schema is written raw (only strings, or no type known)."""
    types = types_of(schema)
    return not types or types == {"string"}


def may_be_string(schema: Any) -> bool:
    """Whether a value of this schema may be a string (llama.cpp's `may_be_string`): such a
    tagged value is raw text in the grammar, whatever other types it allows."""
    types = types_of(schema)
    return not types or "string" in types


def typed(raw: str, schema: Any) -> str:
    """A tagged value as JSON text: a string as written when the schema says string only,
    else the JSON value it spells (a string when it spells none)."""
    if not is_string(schema):
        if raw in ("True", "False") and "boolean" in types_of(schema):
            return "true" if raw == "True" else "false"  # Python's spelling (jinja2 `string`)
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False)
        except ValueError:
            pass
    return json.dumps(raw, ensure_ascii=False)
