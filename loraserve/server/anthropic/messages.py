"""The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, on
the same engine, chat template and adapters as /v1/chat/completions.

The request is converted as llama-server converts it (`anthropic_convert`); the answer is
llama-server's `to_json_anthropic`: `content` blocks (`thinking` with an empty `signature`,
`text`, `tool_use`), `stop_reason` (`end_turn`, `max_tokens`, `tool_use`),
`stop_sequence`, and `usage` (`input_tokens` not counting `cache_read_input_tokens`), no
`timings`. A stream sends Anthropic's named events: `message_start`, for each block
`content_block_start` / `_delta` (`thinking_delta` then `signature_delta`, `text_delta`,
`input_json_delta`) / `_stop` with its index, `message_delta` (stop reason and
`output_tokens`), `message_stop`; an engine error is an `error` event. `lora` and `model`
(naming an adapter) work as in the OpenAI API.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from fastapi import APIRouter
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.chat.formats.parse import ParsedMessage, ToolCall, arguments_object
from loraserve.chat.formats.stream import MessageStream
from loraserve.engine.request import Event
from loraserve.server.anthropic.convert import Converted, MessagesRequest, convert
from loraserve.server.errors import JsonResponse, invalid_request
from loraserve.server.generation import chat_prompt, submit, tokenize_prompt, tokenize_prompts
from loraserve.server.output import Output, collect, stream
from loraserve.server.reasoning_budget import reasoning_budget
from loraserve.server.sse import sse_named
from loraserve.server.state import ServerState, get_state
from loraserve.server.tool_calls import ReplyPlan, continues, plan_reply

router = APIRouter()
Body = dict[str, Any]


async def read_request(request: HttpRequest) -> Converted:
    """The body, converted (a 400 naming the field if it is malformed or bad)."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise invalid_request("the client closed the connection before sending the body") from None
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid_request(f"Invalid JSON in request body: {e}") from None
    except RecursionError:
        raise invalid_request("Invalid JSON in request body: nested too deeply") from None
    if body is None:
        raise invalid_request("request body is required (a JSON object)")
    return await asyncio.to_thread(convert, body) if len(raw) > 1 << 16 else convert(body)


def prompt_of(state: ServerState, chat: Converted) -> str:
    """The chat prompt, rendered as /v1/chat/completions renders it (a last assistant
    message is continued), with the tools given to the template (`tools`)."""
    return chat_prompt(state, chat.params, chat.tools)


async def plan_for(state: ServerState, chat: Converted, prompt: str) -> ReplyPlan:
    """How this request's answer is read: in the template's own format, tools forced
    (`any`, or `tool`: then `tools` holds just that one) or offered (`auto`)."""
    p = chat.params
    has_grammar = any(x is not None for x in (p.grammar, p.json_schema, p.response_format))
    choice = "required" if chat.forced else "auto"
    tools = chat.tools or None
    budget = reasoning_budget(state.cfg, p)
    return await plan_reply(
        state, prompt, tools, choice, chat.parallel, None, has_grammar, budget,
        continuation=continues(state.cfg, p),
    )  # fmt: skip


def reader(plan: ReplyPlan) -> MessageStream:
    """A stream reader of one answer, with Anthropic's `toolu_` ids."""
    return plan.reader(id_prefix="toolu_")


def stop_reason(out: Output, calls: list[ToolCall]) -> str:
    """llama-server's: `max_tokens` unless it stopped at an end token or a stop word."""
    assert out.final is not None
    if str(out.final.stop_type) in ("eos", "word"):
        return "tool_use" if calls else "end_turn"
    return "max_tokens"


def usage(n_prompt: int, n_cached: int, n_out: int) -> Body:
    """Anthropic's `usage`: the reused prompt tokens apart from the evaluated ones."""
    return {
        "cache_read_input_tokens": n_cached,
        "input_tokens": n_prompt - n_cached,
        "output_tokens": n_out,
    }


def message(mid: str, model: str, content: list[Body], out: Output, calls: list[ToolCall]) -> Body:
    """The non-streamed answer."""
    assert out.final is not None
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": stop_reason(out, calls),
        "stop_sequence": out.final.stopping_word or None,
        "usage": usage(out.n_prompt, out.final.n_cached, out.n_generated),
    }


def blocks(msg: ParsedMessage) -> list[Body]:
    """The content blocks of a whole answer: thinking, text, then the tool calls."""
    out: list[Body] = []
    if msg.reasoning_content:
        out.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
    if msg.content:
        out.append({"type": "text", "text": msg.content})
    out += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": arguments_object(c.arguments)}
        for c in msg.tool_calls
    ]
    return out


class StreamWriter:
    """The events of one streamed answer; blocks get consecutive indices, each closed
    before the next one opens."""

    def __init__(self, mid: str, model: str, reader: MessageStream) -> None:
        self.mid, self.model, self.reader = mid, model, reader
        self.started = False
        self.index = -1  # the open block's index
        self.kind: str | None = None  # the open block's kind (None: no block open)

    def chunk(self, i: int, out: Output, ev: Event) -> list[Body]:
        """`output.stream`'s callback."""
        bodies: list[Body] = []
        if not self.started:
            self.started = True
            cached = ev.progress.cache if ev.progress is not None else 0
            head = message(self.mid, self.model, [], out, []) if ev.done else None
            bodies.append(
                {
                    "type": "message_start",
                    "message": {
                        "id": self.mid,
                        "type": "message",
                        "role": "assistant",
                        "content": [],
                        "model": self.model,
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": head["usage"] if head else usage(len(out.prompt), cached, 0),
                    },
                }
            )
            bodies[0]["message"]["usage"]["output_tokens"] = 0
        if ev.text:
            for delta in self.reader.feed(ev.text):
                bodies += self._delta(delta)
        if ev.done:
            bodies += self._end(out)
        return bodies

    def _open(self, kind: str, block: Body) -> list[Body]:
        out = self._close()
        self.index += 1
        self.kind = kind
        return [*out, {"type": "content_block_start", "index": self.index, "content_block": block}]

    def _close(self) -> list[Body]:
        if self.kind is None:
            return []
        out: list[Body] = []
        if self.kind == "reasoning":  # Anthropic's clients want a signature first
            out.append(self._event({"type": "signature_delta", "signature": ""}))
        self.kind = None
        return [*out, {"type": "content_block_stop", "index": self.index}]

    def _event(self, delta: Body) -> Body:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def _delta(self, delta: Body) -> list[Body]:
        """The events of one OpenAI-style delta (reasoning, content, or a call's head or
        argument fragment)."""
        if "tool_calls" in delta:
            out: list[Body] = []
            for c in delta["tool_calls"]:
                if "id" in c:
                    block = {"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                             "input": {}}  # fmt: skip
                    out += self._open("tool_use", block)
                fragment = c["function"].get("arguments", "")
                if fragment:
                    out.append(self._event({"type": "input_json_delta", "partial_json": fragment}))
            return out
        kind = "reasoning" if "reasoning_content" in delta else "content"
        text = delta.get("reasoning_content") or delta.get("content") or ""
        out = []
        if self.kind != kind:
            block = (
                {"type": "thinking", "thinking": ""}
                if kind == "reasoning"
                else {"type": "text", "text": ""}
            )
            out = self._open(kind, block)
        if kind == "reasoning":
            return [*out, self._event({"type": "thinking_delta", "thinking": text})]
        return [*out, self._event({"type": "text_delta", "text": text})]

    def _end(self, out: Output) -> list[Body]:
        assert out.final is not None
        bodies = [b for delta in self.reader.finish() for b in self._delta(delta)]
        assert self.reader.final is not None
        calls = self.reader.final.tool_calls
        bodies += self._close()
        delta = {"stop_reason": stop_reason(out, calls), "stop_sequence": None}
        delta["stop_sequence"] = out.final.stopping_word or None
        bodies.append(
            {"type": "message_delta", "delta": delta, "usage": {"output_tokens": out.n_generated}}
        )
        return [*bodies, {"type": "message_stop"}]


@router.post("/v1/messages")
async def messages(request: HttpRequest) -> Response:
    """Anthropic Messages (see the module docstring)."""
    state = get_state(request)
    state.require()
    chat = await read_request(request)
    params: MessagesRequest = chat.params.with_defaults(state.cfg.request_defaults())
    prompt = await asyncio.to_thread(prompt_of, state, chat)  # Jinja: off the loop
    plan = await plan_for(state, chat, prompt)
    prompts = await tokenize_prompts(state, [prompt])
    # a stream's progress events give message_start the cached prompt tokens
    flight = await submit(
        state, prompts, params, adapter_name=params.model, progress=params.stream,
        grammar=await plan.engine_grammar(state, params),
    )  # fmt: skip
    model = flight.mix.named or state.model_name  # the adapter `model` named, else the model
    mid = f"msg_{uuid.uuid4().hex}"
    if params.stream:
        return stream(flight, StreamWriter(mid, model, reader(plan)).chunk, frame=sse_named)
    (out,) = await collect(flight, request)
    read = reader(plan)
    read.feed(out.text)
    read.finish()
    assert read.final is not None
    calls = read.final.tool_calls
    return JsonResponse(message(mid, model, blocks(read.final), out, calls))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: HttpRequest) -> Response:
    """The prompt tokens a Messages request takes, without running it (`input_tokens`)."""
    state = get_state(request)
    tok = state.require().tokenizer
    chat = await read_request(request)

    def count() -> int:
        return len(tokenize_prompt(tok, prompt_of(state, chat)))

    return JsonResponse({"input_tokens": await asyncio.to_thread(count)})
