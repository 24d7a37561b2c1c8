"""The OpenAI Responses API, minimal as llama-server's: `POST /v1/responses` (and
`/responses`) on the chat path.

The request is converted as llama-server converts it (`server_chat_convert_responses_to_chatcmpl`,
tools/server/server-chat.cpp): `instructions` a system message, `input` a string (one user
message) or items (messages with `input_text`/`output_text` parts, `function_call` and
`function_call_output` items), `max_output_tokens` is `max_tokens`; the other fields are
/v1/chat/completions'; function `tools` (Responses' flat form) are called in the template's
own format (`server/tool_calls.py`). `previous_response_id` is refused, as llama-server
does. The answer is a `response` object with its output items (`reasoning`, `message`,
`function_call`: `responses_items.py`); a stream sends llama-server's named events
(`response.created`, `response.in_progress`, with `prompt_progress` when asked, then per
item `response.output_item.added` and its deltas, the `.done` events and
`response.completed`, or `response.incomplete` with `incomplete_details` when the token limit cut
the answer).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.engine.request import Event, StopType
from loraserve.server.errors import JsonResponse, invalid_request, parse_body
from loraserve.server.generation import chat_prompt, submit, tokenize_prompts
from loraserve.server.grammar import grammar_spec
from loraserve.server.openai.responses_items import ItemEvents, chat_tools, output_items
from loraserve.server.output import Output, collect, stream
from loraserve.server.reasoning_budget import reasoning_budget
from loraserve.server.schemas import OAIChatRequest
from loraserve.server.sse import sse_named
from loraserve.server.state import get_state
from loraserve.server.tool_calls import (
    continues,
    is_response_format,
    plan_reply,
    tool_choice_of,
)

router = APIRouter()
Body = dict[str, Any]
TEXT_PARTS = {"input_text": "text", "output_text": "text"}


def _parts(content: Any, where: str) -> list[Body]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid_request(f"{where}.content: must be a string or a list of parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise invalid_request(
                f"{where}.content[{j}]: expected an input_text or output_text part with text"
                " (this server is text-only)"
            )
        out.append({"type": "text", "text": part["text"]})
    return out


def _item(item: Any, where: str) -> Body:
    if not isinstance(item, dict):
        raise invalid_request(f"{where}: expected an object")
    kind = item.get("type", "message")
    if kind == "message" and isinstance(item.get("role"), str):
        return {"role": item["role"], "content": _parts(item.get("content", ""), where)}
    if kind == "function_call":
        fn = {"name": item.get("name"), "arguments": item.get("arguments")}
        call = {"id": item.get("call_id"), "type": "function", "function": fn}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else json.dumps(output)
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": text}
    raise invalid_request(f"{where}: cannot determine the type of the item")


def to_chat(body: Any) -> OAIChatRequest:
    """The request as a chat request; a 400 naming the field if it is bad."""
    if not isinstance(body, dict):
        raise invalid_request("request body must be a JSON object")
    if "input" not in body:
        raise invalid_request("input: 'input' is required")
    if body.get("previous_response_id"):
        raise invalid_request("previous_response_id: not supported (as llama.cpp)")
    chat = {k: v for k, v in body.items() if k not in ("input", "instructions", "reasoning")}
    chat["tools"], chat["tool_choice"] = chat_tools(body)
    messages: list[Body] = []
    if body.get("instructions") is not None:
        messages.append({"role": "system", "content": body["instructions"]})
    value = body["input"]
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        messages += [_item(it, f"input[{i}]") for i, it in enumerate(value)]
    else:
        raise invalid_request("input: must be a string or a list of items")
    chat["messages"] = messages
    if "max_output_tokens" in chat:
        chat["max_tokens"] = chat.pop("max_output_tokens")
    return parse_body(OAIChatRequest, chat)


def ending(out: Output) -> dict[str, Any]:
    """`status` and `incomplete_details` of a finished response, as OpenAI's: an answer the
    token limit cut is `incomplete` for `max_output_tokens` (streamed: `response.incomplete`)."""
    if out.final is not None and out.final.stop_type == StopType.LIMIT:
        return {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    return {"status": "completed", "incomplete_details": None}


def usage(out: Output) -> Body:
    cached = out.final.n_cached if out.final is not None else 0
    return {
        "input_tokens": out.n_prompt,
        "output_tokens": out.n_generated,
        "total_tokens": out.n_prompt + out.n_generated,
        "input_tokens_details": {"cached_tokens": cached},
    }


@router.post("/v1/responses")
@router.post("/responses")
async def responses(request: HttpRequest) -> Response:
    """OpenAI Responses (see the module docstring)."""
    state = get_state(request)
    state.require()
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise invalid_request(f"Invalid JSON in request body: {e}") from None
    params = to_chat(body).with_defaults(state.cfg.request_defaults())
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
        state, prompts, params, adapter_name=params.model, progress=params.stream,
        grammar=await plan.engine_grammar(state, params),
    )  # fmt: skip
    model = flight.mix.named or state.model_name
    rid, mid = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
    head = {"id": rid, "object": "response", "status": "in_progress"}
    if not params.stream:
        (out,) = await collect(flight, request)
        t = int(time.time())
        reader = plan.reader(stream=False)
        reader.feed(out.text)
        reader.finish()
        assert reader.final is not None
        output = output_items(reader.final, mid)
        res = {"completed_at": t, "created_at": t, "id": rid, "model": model}
        res |= {"object": "response", "output": output, **ending(out)}
        return JsonResponse({**res, "usage": usage(out)})
    seen = {"created": False}
    reader = plan.reader()
    items = ItemEvents(mid)

    def chunk(i: int, out: Output, ev: Event) -> list[Body]:
        events: list[Body] = []
        if not seen["created"]:
            seen["created"] = True
            events += [{"type": "response.created", "response": head}]
            events += [{"type": "response.in_progress", "response": head}]
        elif ev.progress is not None and params.return_progress:
            events.append({"type": "response.in_progress", "response": head})
        deltas = reader.feed(ev.text) if ev.text else []
        if ev.done:
            deltas += reader.finish()
        for d in deltas:
            events += items.delta(d)
        if events and params.timings_per_token and ev.token is not None:
            events[-1]["timings"] = out.partial_timings()
        if events and ev.progress is not None and params.return_progress:
            events[-1]["prompt_progress"] = ev.progress.as_dict()
        if ev.done:
            closing, output = items.finish()
            events += closing
            final = {**head, "created_at": int(time.time()), **ending(out)}
            final |= {"model": model, "output": output, "usage": usage(out)}
            done = {"response": final, "timings": out.timings()}
            events.append({"type": f"response.{final['status']}", **done})
        return events

    return stream(flight, chunk, frame=sse_named)
