"""`POST /chat/completions/input_tokens` and `/responses/input_tokens` (also under `/v1`):
how many tokens a chat (or Responses) request's prompt takes, rendered with the server's chat
template exactly as its endpoint renders it, without running it (llama-server's
`{"input_tokens", "object"}` answer)."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import JsonResponse, invalid_request
from loraserve.server.generation import chat_prompt, tokenize_prompt
from loraserve.server.openai.responses import to_chat
from loraserve.server.schemas import OAIChatRequest
from loraserve.server.state import get_state

router = APIRouter()


@router.post("/chat/completions/input_tokens", openapi_extra=body_doc(OAIChatRequest))
@router.post("/v1/chat/completions/input_tokens", openapi_extra=body_doc(OAIChatRequest))
async def chat_input_tokens(request: HttpRequest) -> Response:
    """The token count of a chat request's prompt (see the module docstring)."""
    state = get_state(request)
    tok = state.require().tokenizer
    params = await read_body(request, OAIChatRequest)

    def count() -> int:
        return len(tokenize_prompt(tok, chat_prompt(state, params)))

    n = await asyncio.to_thread(count)
    return JsonResponse({"input_tokens": n, "object": "response.input_tokens"})


@router.post("/responses/input_tokens")
@router.post("/v1/responses/input_tokens")
async def responses_input_tokens(request: HttpRequest) -> Response:
    """The token count of an OpenAI Responses request's prompt (`input`, `instructions`),
    rendered as `/v1/responses` renders it."""
    state = get_state(request)
    tok = state.require().tokenizer
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise invalid_request(f"Invalid JSON in request body: {e}") from None
    params = to_chat(body)

    def count() -> int:
        return len(tokenize_prompt(tok, chat_prompt(state, params)))

    n = await asyncio.to_thread(count)
    return JsonResponse({"input_tokens": n, "object": "response.input_tokens"})
