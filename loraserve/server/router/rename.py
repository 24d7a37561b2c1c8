"""Answers of a shared engine under the name of the preset that asked: an engine serving
several presets calls itself by one of them (its first alias), so the `model` (and
`model_alias`) its JSON answers and stream events carry is replaced by the requested preset's
name, as llama-server's one-process-per-preset router answers.

Only top-level fields (and Anthropic's `message.model`) are renamed, and only where they hold
the engine's own name; a `model` naming an adapter is left as it is.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Send

_KEYS = ("model", "model_alias")


def _rename(obj: Any, old: str, new: str) -> bool:
    changed = False
    if isinstance(obj, dict):
        for key in _KEYS:
            if obj.get(key) == old:
                obj[key] = new
                changed = True
        if isinstance(obj.get("message"), dict) and obj["message"].get("model") == old:
            obj["message"]["model"] = new
            changed = True
    return changed


def rename_json(raw: bytes, old: str, new: str) -> bytes:
    """A JSON body with the engine's name replaced (unchanged if not JSON)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return raw
    return json.dumps(obj, ensure_ascii=False).encode() if _rename(obj, old, new) else raw


def rename_events(raw: bytes, old: str, new: str) -> bytes:
    """Server-sent events with the engine's name replaced in each `data:` JSON line."""
    if old.encode() not in raw:
        return raw
    lines = raw.decode("utf-8", "surrogateescape").split("\n")
    for i, line in enumerate(lines):
        if line.startswith("data: ") and line[6:].lstrip().startswith("{"):
            lines[i] = "data: " + rename_json(line[6:].encode(), old, new).decode()
    return "\n".join(lines).encode("utf-8", "surrogateescape")


def renaming_send(send: Send, old: str, new: str) -> Send:
    """`send` that renames the engine `old` to `new` in JSON answers (held until whole, their
    content-length fixed) and in event streams (per event)."""
    if old == new:
        return send
    kind = ""
    start: Message | None = None
    held: list[bytes] = []

    async def wrapped(message: Message) -> None:
        nonlocal kind, start
        if message["type"] == "http.response.start":
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            kind = "json" if b"json" in ctype else "sse" if b"event-stream" in ctype else ""
            if kind == "json":
                start = message
                return
            await send(message)
        elif message["type"] == "http.response.body" and kind == "json":
            held.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = rename_json(b"".join(held), old, new)
            assert start is not None
            headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        elif message["type"] == "http.response.body" and kind == "sse":
            await send({**message, "body": rename_events(message.get("body", b""), old, new)})
        else:
            await send(message)

    return wrapped
