"""Server-sent events framing: `data: {json}\\n\\n` events, the OpenAI `[DONE]` marker, and
the streaming response both APIs answer with."""

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


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    """A `text/event-stream` response of `events`, unbuffered by proxies."""
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
