"""Server-sent events framing: `data: {json}\\n\\n` events, the OpenAI `[DONE]` marker,
Anthropic's named events, and the streaming response every API answers with."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from loraserve.server.errors import json_dumps

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(obj: Any) -> bytes:
    """One server-sent event: `data: {json}\\n\\n`."""
    return f"data: {json_dumps(obj)}\n\n".encode("utf-8", "replace")


def sse_named(obj: dict[str, Any]) -> bytes:
    """One server-sent event named by its body's `type` (Anthropic's framing:
    `event: TYPE\\ndata: {json}\\n\\n`); an error answer's body (`{"error": ...}`) is sent
    as an `error` event, `{"type": "error", "error": ...}`."""
    if "type" not in obj and "error" in obj:
        obj = {"type": "error", "error": obj["error"]}
    return f"event: {obj['type']}\ndata: {json_dumps(obj)}\n\n".encode("utf-8", "replace")


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    """A `text/event-stream` response of `events`, unbuffered by proxies."""
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
