"""OpenAI-compatible endpoints: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

They take /completion's fields too (`lora`, `cache_prompt`, `n_probs`...). **Ours:**
`model` may name a loaded adapter, which then runs at scale 1 (as vLLM and LoRAX do);
any other `model` is echoed and ignored, as llama-server does. Streams end with
`data: [DONE]`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response, StreamingResponse

from loraserve.engine.request import Event
from loraserve.server.chat_template import render_chat
from loraserve.server.completion import SSE_HEADERS
from loraserve.server.errors import (
    SSE_DONE,
    JsonResponse,
    invalid_request,
    server_error,
    sse_event,
)
from loraserve.server.generation import (
    Output,
    collect,
    submit,
    token_prob,
    tokenize_prompts,
)
from loraserve.server.oai_format import (
    chat_logprobs,
    finish_reason,
    object_head,
    text_logprobs,
    usage,
)
from loraserve.server.schemas import OAIChatRequest, OAICompletionRequest
from loraserve.server.state import (
    Flight,
    ServerState,
    body_doc,
    error_of,
    get_state,
    read_body,
    wait,
)

router = APIRouter()


def render(state: ServerState, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    """The chat prompt from the model's template (ChatML when it has none); 400 on failure."""
    tok = state.require().tokenizer
    bos = tok.piece(tok.bos_id) if tok.bos_id is not None else ""
    eos = tok.piece(tok.eos_id) if tok.eos_id is not None else ""
    try:
        return render_chat(
            tok.chat_template,
            messages,
            bos,
            eos,
            add_generation_prompt,
            add_bos=tok.add_bos,
            add_eos=tok.add_eos,
        )
    except ValueError as e:
        raise invalid_request(str(e)) from None


async def _run(flight: Flight, request: HttpRequest) -> list[Output]:
    outs = await collect(flight, request)
    for out in outs:
        if out.final is None:
            raise server_error("request cancelled")
        if out.final.error:
            raise error_of(out.final)
    return outs


async def _sse(
    flight: Flight,
    chunk: Callable[[int, Output, Event], dict[str, Any] | None],
    tail: Callable[[list[Output]], list[dict[str, Any]]],
) -> AsyncIterator[bytes]:
    outs = [Output(prompt=r.prompt) for r in flight.reqs]
    try:
        async for i, ev in flight.events():
            outs[i].add(ev)
            if ev.error:
                yield sse_event(error_of(ev).body())
                continue
            body = chunk(i, outs[i], ev)
            if body is not None:
                yield sse_event(body)
        if all(o.final is not None and not o.final.error for o in outs):
            for body in tail(outs):
                yield sse_event(body)
        yield SSE_DONE
    finally:
        flight.close()


def _stream(gen: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("/v1/completions", openapi_extra=body_doc(OAICompletionRequest))
async def completions(request: HttpRequest) -> Response:
    """OpenAI text completions (one choice per prompt)."""
    state = get_state(request)
    tok = state.require().tokenizer
    params = await read_body(request, OAICompletionRequest)
    params = params.with_defaults(state.cfg.request_defaults())
    prompts = await tokenize_prompts(state, params.prompt)
    flight = await submit(state, prompts, params, adapter_name=params.model)
    head = object_head(
        "text_completion",
        f"cmpl-{uuid.uuid4().hex}",
        int(time.time()),
        params.model or state.model_name,
    )
    if params.stream:
        want_usage = bool(params.stream_options and params.stream_options.include_usage)

        def chunk(i: int, out: Output, ev: Event) -> dict[str, Any] | None:
            if not ev.done and ev.token is None:
                return None
            choice: dict[str, Any] = {
                "text": ev.text,
                "index": i,
                "logprobs": None,
                "finish_reason": finish_reason(out) if ev.done else None,
            }
            if params.n_probs and ev.probs is not None and ev.token is not None:
                one = Output(prompt=[], probs=[(ev.token, token_prob(ev), ev.probs)])
                choice["logprobs"] = text_logprobs(tok, one)
            return {**head, "choices": [choice]}

        def tail(outs: list[Output]) -> list[dict[str, Any]]:
            return [{**head, "choices": [], "usage": usage(outs)}] if want_usage else []

        return _stream(_sse(flight, chunk, tail))
    outs = await _run(flight, request)
    choices = [
        {
            "text": o.text,
            "index": i,
            "logprobs": text_logprobs(tok, o) if params.n_probs else None,
            "finish_reason": finish_reason(o),
        }
        for i, o in enumerate(outs)
    ]
    body = {**head, "choices": choices, "usage": usage(outs)}
    if len(outs) == 1:
        body["timings"] = outs[0].timings()
    return JsonResponse(body)


@router.post("/v1/chat/completions", openapi_extra=body_doc(OAIChatRequest))
@router.post("/chat/completions", openapi_extra=body_doc(OAIChatRequest))
async def chat_completions(request: HttpRequest) -> Response:
    """OpenAI chat completions: messages rendered with the model's chat template."""
    state = get_state(request)
    tok = state.require().tokenizer
    params = await read_body(request, OAIChatRequest)
    params = params.with_defaults(state.cfg.request_defaults())
    prompts = await tokenize_prompts(
        state, [render(state, params.messages, params.add_generation_prompt)]
    )
    flight = await submit(state, prompts, params, adapter_name=params.model)
    head = object_head(
        "chat.completion.chunk" if params.stream else "chat.completion",
        f"chatcmpl-{uuid.uuid4().hex}",
        int(time.time()),
        params.model or state.model_name,
    )
    if params.stream:
        want_usage = bool(params.stream_options and params.stream_options.include_usage)
        first = [True]

        def chunk(i: int, out: Output, ev: Event) -> dict[str, Any] | None:
            delta: dict[str, Any] = {}
            if first[0]:
                delta["role"] = "assistant"
                first[0] = False
            if ev.text:
                delta["content"] = ev.text
            if not delta and not ev.done and not (params.n_probs and ev.probs is not None):
                return None
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason(out) if ev.done else None,
            }
            if params.n_probs and ev.probs is not None and ev.token is not None:
                choice["logprobs"] = chat_logprobs(tok, [(ev.token, token_prob(ev), ev.probs)])
            return {**head, "choices": [choice]}

        def tail(outs: list[Output]) -> list[dict[str, Any]]:
            return [{**head, "choices": [], "usage": usage(outs)}] if want_usage else []

        return _stream(_sse(flight, chunk, tail))
    (out,) = await _run(flight, request)
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": out.text},
        "logprobs": chat_logprobs(tok, out.probs) if params.n_probs else None,
        "finish_reason": finish_reason(out),
    }
    return JsonResponse(
        {**head, "choices": [choice], "usage": usage([out]), "timings": out.timings()}
    )


@router.get("/v1/models")
@router.get("/models")
async def models(request: HttpRequest) -> Response:
    """The model, then every loaded adapter as a model of its own (selectable by name)."""
    state = get_state(request)
    state.require()
    assert state.model is not None
    cfg = state.model.config
    created = int(state.started)
    name = state.model_name
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "llamacpp",
            "meta": {
                "n_vocab": cfg.vocab_size,
                "n_ctx_train": cfg.context_length,
                "n_embd": cfg.hidden_size,
            },
        }
    ]
    listed = [a for a, _ in await wait(state.require().list_adapters())]
    data += [
        {
            "id": a.name,
            "object": "model",
            "created": created,
            "owned_by": "loraserve",
            "parent": name,
            "meta": {"lora_id": a.id},
        }
        for a in listed
    ]
    return JsonResponse({"object": "list", "data": data})
