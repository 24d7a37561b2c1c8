"""`POST /chat/completions/input_tokens` (also under `/v1`): how many tokens a chat request's
prompt takes, rendered with the server's chat template exactly as `/v1/chat/completions`
renders it, without running it (llama-server's `{"input_tokens", "object"}` answer)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import JsonResponse
from loraserve.server.generation import chat_prompt, tokenize_prompt
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
