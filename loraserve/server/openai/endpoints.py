"""OpenAI-compatible endpoints: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

They take /completion's fields too (`lora`, `cache_prompt`, `n_probs`...). **Ours:**
`model` may name a loaded adapter, which then runs at scale 1 (as vLLM and LoRAX do);
any other `model` is echoed and ignored, as llama-server does. Streams end with
`data: [DONE]`. The response pieces (object heads, usage, logprobs, finish reasons) are
built in `openai.pieces`; submission and output go the same way as /completion's. Chat
answers are read in the template's own format (`server/tool_calls.py`):
`reasoning_content`, `tool_calls` (streamed as OpenAI deltas: a call's index, id, type and
name first, then argument fragments) and `finish_reason: "tool_calls"`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.chat.formats.stream import MessageStream, message_dict
from loraserve.engine.request import Event
from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import JsonResponse
from loraserve.server.flight import wait
from loraserve.server.generation import chat_prompt, submit, tokenize_prompts
from loraserve.server.grammar import grammar_spec
from loraserve.server.native.lora_api import offered
from loraserve.server.native.results import final_result
from loraserve.server.openai.pieces import (
    chat_logprobs,
    finish_reason,
    object_head,
    text_logprobs,
    usage,
)
from loraserve.server.output import Output, collect, stream, token_prob
from loraserve.server.reasoning_budget import reasoning_budget
from loraserve.server.schemas import OAIChatRequest, OAICompletionRequest
from loraserve.server.state import get_state
from loraserve.server.tool_calls import (
    continues,
    is_response_format,
    plan_reply,
    tool_choice_of,
)

router = APIRouter()


@router.post("/v1/completions", openapi_extra=body_doc(OAICompletionRequest))
async def completions(request: HttpRequest) -> Response:
    """OpenAI text completions (`n` choices per prompt, prompt-major)."""
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
        flight.mix.named or state.model_name,  # the adapter `model` named, else the model
    )
    if params.stream:
        want_usage = bool(params.stream_options and params.stream_options.include_usage)

        def chunk(i: int, out: Output, ev: Event) -> dict[str, Any] | None:
            if ev.progress is not None and params.return_progress:
                choice = {"text": "", "index": i, "logprobs": None, "finish_reason": None}
                return {**head, "choices": [choice], "prompt_progress": ev.progress.as_dict()}
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
            return [{**head, "choices": [], "usage": usage(outs, params.n)}] if want_usage else []

        return stream(flight, chunk, tail, done_marker=True)
    outs = await collect(flight, request)
    choices = [
        {
            "text": o.text,
            "index": i,
            "logprobs": text_logprobs(tok, o) if params.n_probs else None,
            "finish_reason": finish_reason(o),
        }
        for i, o in enumerate(outs)
    ]
    body = {**head, "choices": choices, "usage": usage(outs, params.n)}
    if len(outs) == 1:
        body["timings"] = outs[0].timings()
        if state.cfg.verbose or params.verbose:  # as llama-server: the native result too
            body["__verbose"] = final_result(state, outs[0], params, flight.mix, 0, outs[0].text)
    return JsonResponse(body)


@router.post("/v1/chat/completions", openapi_extra=body_doc(OAIChatRequest))
@router.post("/chat/completions", openapi_extra=body_doc(OAIChatRequest))
async def chat_completions(request: HttpRequest) -> Response:
    """OpenAI chat completions: messages rendered with the model's chat template."""
    state = get_state(request)
    tok = state.require().tokenizer
    params = await read_body(request, OAIChatRequest)
    params = params.with_defaults(state.cfg.request_defaults())
    # Jinja: off the loop
    prompt = await asyncio.to_thread(chat_prompt, state, params, params.tools)
    choice = tool_choice_of(params.tools, params.tool_choice)
    constrained = grammar_spec(params.grammar, params.json_schema, params.response_format)
    plan = await plan_reply(
        state, prompt, params.tools, choice, params.parallel_tool_calls,
        params.reasoning_format, constrained is not None,
        reasoning_budget(state.cfg, params), is_response_format(constrained),
        continues(state.cfg, params),
    )  # fmt: skip
    prompts = await tokenize_prompts(state, [prompt])
    flight = await submit(
        state,
        prompts,
        params,
        adapter_name=params.model,
        grammar=await plan.engine_grammar(state, params),
    )
    head = object_head(
        "chat.completion.chunk" if params.stream else "chat.completion",
        f"chatcmpl-{uuid.uuid4().hex}",
        int(time.time()),
        flight.mix.named or state.model_name,  # the adapter `model` named, else the model
    )
    if params.stream:
        want_usage = bool(params.stream_options and params.stream_options.include_usage)
        started: set[int] = set()
        readers: dict[int, MessageStream] = {}

        def chunk(i: int, out: Output, ev: Event) -> list[dict[str, Any]] | None:
            role = {"index": i, "delta": {"role": "assistant", "content": None}}
            if ev.progress is not None:  # as llama-server: a role-only chunk, with the progress
                if not params.return_progress:
                    return None
                progress = ev.progress.as_dict()
                choice = {**role, "logprobs": None, "finish_reason": None}
                return [{**head, "choices": [choice], "prompt_progress": progress}]
            lead = []
            if i not in started:  # as llama-server: a role-only chunk first, per choice
                lead.append(
                    {**head, "choices": [{**role, "logprobs": None, "finish_reason": None}]}
                )
                started.add(i)
            delta: dict[str, Any] = {}
            if plan.parses:
                reader = readers.setdefault(i, plan.reader())
                deltas = reader.feed(ev.text) if ev.text else []
                if ev.done:
                    deltas += reader.finish()
                *extra, delta = deltas or [{}]
                lead += [{**head, "choices": [{"index": i, "delta": d, "logprobs": None,
                          "finish_reason": None}]} for d in extra]  # fmt: skip
            elif ev.text:
                delta["content"] = ev.text
            if not delta and not ev.done and not (params.n_probs and ev.probs is not None):
                return lead or None
            final = readers[i].final if ev.done and plan.parses else None
            choice: dict[str, Any] = {
                "index": i,
                "delta": delta,
                "logprobs": None,
                "finish_reason": None,
            }
            if ev.done:
                choice["finish_reason"] = finish_reason(out, bool(final and final.tool_calls))
            if params.n_probs and ev.probs is not None and ev.token is not None:
                choice["logprobs"] = chat_logprobs(tok, [(ev.token, token_prob(ev), ev.probs)])
            body = {**head, "choices": [choice]}
            if ev.done:  # as llama-server: the last chunk carries the timings (else the usage's)
                return [*lead, {**body, "id_slot": ev.id_slot, **({} if want_usage else
                        {"timings": out.timings()})}]  # fmt: skip
            if params.timings_per_token:
                body["timings"] = out.partial_timings()
            return [*lead, body]

        def tail(outs: list[Output]) -> list[dict[str, Any]]:
            if not want_usage:
                return []
            return [{**head, "choices": [], "usage": usage(outs, params.n),
                     "timings": outs[-1].timings()}]  # fmt: skip

        return stream(flight, chunk, tail, done_marker=True)
    outs = await collect(flight, request)
    choices = []
    for i, o in enumerate(outs):
        msg = {"role": "assistant", "content": o.text}
        if plan.parses:  # read as a stream reads it: the same message, a cut call included
            reader = plan.reader(stream=False)
            reader.feed(o.text)
            reader.finish()
            assert reader.final is not None
            msg = message_dict(reader.final)
        choices.append(
            {
                "index": i,
                "message": msg,
                "logprobs": chat_logprobs(tok, o.probs) if params.n_probs else None,
                "finish_reason": finish_reason(o, bool(msg.get("tool_calls"))),
            }
        )
    out = outs[0]
    body = {**head, "choices": choices, "usage": usage(outs, params.n), "timings": out.timings()}
    if state.cfg.verbose or params.verbose:  # as llama-server: the native result too
        body["__verbose"] = final_result(state, out, params, flight.mix, 0, out.text)
    return JsonResponse(body)


@router.get("/v1/models")
@router.get("/models")
async def models(request: HttpRequest) -> Response:
    """The model, then every adapter as a model of its own (selectable by name): the
    registered ones, then what `--lora-dir` and `--lora-modules` offer (read on first use),
    with vLLM's `root` (the adapter's path) and `parent` (the model, or the base model a
    `--lora-modules` entry's JSON form names, as vLLM's)."""
    state = get_state(request)
    state.require()
    assert state.model is not None
    cfg = state.model.config
    created = int(state.started)
    name = state.model_name
    data = [
        {
            "id": name,
            "aliases": list(state.cfg.alias),  # `--alias` (sorted: the first is `id`)
            "tags": list(state.cfg.tags),  # `--tags`
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
    engine = state.require()
    listed = [a for a, _ in await wait(engine.list_adapters())]
    entries, parents = await offered(engine, listed)
    adapters = [(a.name, a.path, a.id, bool(a.weights)) for a in listed]
    adapters += [(e.name, e.path, None, False) for e in entries]
    data += [
        {
            "id": a_name,
            "object": "model",
            "created": created,
            "owned_by": "loraserve",
            "root": str(path),
            "parent": parents.get((a_name.casefold(), str(path)), name),
            "meta": {"lora_id": lora_id, "loaded": loaded},
        }
        for a_name, path, lora_id, loaded in adapters
    ]
    return JsonResponse({"object": "list", "data": data})
