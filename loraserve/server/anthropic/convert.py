"""An Anthropic Messages request as a chat request, as llama-server converts it
(`server_chat_convert_anthropic_to_oai`, tools/server/server-chat.cpp).

`system` (a string or text blocks, concatenated) becomes the first message; each message's
blocks become chat messages: text parts, `thinking` as `reasoning_content`, `tool_use` as
OpenAI `tool_calls`, and each `tool_result` a `tool` message after it. `tools` become
OpenAI functions (rendered by a template that takes `tools`), `stop_sequences` is `stop`,
`max_tokens` defaults to 4096; the sampling fields, `lora` and `model` (naming an
adapter) are /v1/chat/completions' own. **Ours:** a block of an unknown type, or an image
(this server is text-only), is a 400 naming it (llama-server drops unknown blocks and
answers 500 for an image); `tool_choice` any/tool forces a call in the template's own
format (`server/tool_calls.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from loraserve.server.errors import invalid_request, parse_body
from loraserve.server.fields import Messages
from loraserve.server.schemas import _GenerationParams

DEFAULT_MAX_TOKENS = 4096  # llama-server's, when a request leaves max_tokens out
# Anthropic's own fields, converted here; every other field passes to the chat request.
OWN = {"system", "messages", "tools", "tool_choice", "stop_sequences", "thinking", "metadata"}
DROPPED = {"n", "n_cmpl", "stream_options"}  # one answer per request


class MessagesRequest(_GenerationParams):
    """The converted request: /v1/chat/completions' fields (`messages` may be empty)."""

    messages: Messages = Field(default_factory=list)
    model: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool | None = None  # a last assistant message is continued
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_budget_tokens: int | None = Field(None, ge=-1)  # from `thinking.budget_tokens`


@dataclass
class Converted:
    """The chat request, the tools in OpenAI form, and whether a tool call is forced."""

    params: MessagesRequest
    tools: list[dict[str, Any]] = field(default_factory=list)
    forced: bool = False
    parallel: bool = True  # tool_choice.disable_parallel_tool_use false (the default)


def _text(block: dict[str, Any], where: str, key: str = "text") -> str:
    value = block.get(key, "")
    if not isinstance(value, str):
        raise invalid_request(f"{where}.{key}: must be a string")
    return value


def _system(value: Any) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid_request("system: must be a string or a list of text blocks")
    out = ""
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid_request(f"system[{j}]: expected a text block ({{'type': 'text', ...}})")
        out += _text(block, f"system[{j}]")
    return out


def _no_image(where: str) -> None:
    raise invalid_request(
        f"{where}: image input is not supported (this server serves a text-only model)"
    )


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    tool_id = _text(block, where, "tool_use_id")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = ""
        for k, part in enumerate(content):
            here = f"{where}.content[{k}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image":
                _no_image(here)
            if kind != "text":
                raise invalid_request(f"{here}: expected a text block, got type {kind!r}")
            text += _text(part, here)
    else:
        raise invalid_request(f"{where}.content: must be a string or a list of blocks")
    return {"role": "tool", "tool_call_id": tool_id, "content": text}


def _blocks(role: str, blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """One message's blocks as chat messages: the message itself, then its tool results."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    reasoning = ""
    for j, block in enumerate(blocks):
        here = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, here)})
        elif kind == "thinking":
            reasoning += _text(block, here, "thinking")
        elif kind == "redacted_thinking":
            continue  # opaque to any model but the one that wrote it
        elif kind == "image":
            _no_image(here)
        elif kind == "tool_use":
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise invalid_request(f"{here}.input: must be an object")
            name = _text(block, here, "name")
            fn = {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}
            calls.append({"id": _text(block, here, "id"), "type": "function", "function": fn})
        elif kind == "tool_result":
            results.append(_tool_result(block, here))
        else:
            raise invalid_request(
                f"{here}.type: unsupported content block type {kind!r} (expected text, "
                "thinking, tool_use or tool_result)"
            )
    out: list[dict[str, Any]] = []
    if parts or calls or reasoning:
        msg: dict[str, Any] = {"role": role, "content": parts or ""}
        if calls:
            msg["tool_calls"] = calls
        if reasoning:
            msg["reasoning_content"] = reasoning
        out.append(msg)
    return out + results


def convert_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`system` and `messages` as chat messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        out.append({"role": "system", "content": _system(body["system"])})
    if "messages" not in body:
        raise invalid_request("messages: missing ('messages' is required)")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise invalid_request("messages: expected a list of messages")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid_request(f"{where}: expected an object with 'role' and 'content'")
        role = msg.get("role")
        if not isinstance(role, str):
            raise invalid_request(f"{where}.role: missing or not a string")
        content = msg.get("content")
        if content is None:
            if role != "assistant":
                raise invalid_request(f"{where}.content: missing (required for role {role!r})")
        elif isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out += _blocks(role, content, where)
        else:
            raise invalid_request(f"{where}.content: must be a string or a list of blocks")
    return out


def convert_tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """`tools` as OpenAI functions, and whether `tool_choice` forces a call (`any`, or
    `tool` naming one: then only that one is offered); `none` offers none."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise invalid_request("tools: must be a list of tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise invalid_request(f"{where}.name: missing or not a string")
        schema = tool.get("input_schema", {})
        if not isinstance(schema, dict):
            raise invalid_request(f"{where}.input_schema: must be a JSON schema object")
        fn = {"name": tool["name"], "description": _text(tool, where, "description")}
        out.append({"type": "function", "function": {**fn, "parameters": schema}})
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise invalid_request("tool_choice.type: must be one of auto, any, tool, none")
    if kind == "none":
        return [], False
    if kind == "tool":
        name = choice.get("name")
        out = [t for t in out if t["function"]["name"] == name]
        if not out:
            raise invalid_request(f"tool_choice.name: no tool named {name!r} in tools")
    if kind in ("any", "tool") and not out:
        raise invalid_request(f"tool_choice: {kind!r} needs at least one tool in tools")
    return out, kind in ("any", "tool")


def convert(body: Any) -> Converted:
    """The whole request (see the module docstring); a 400 naming the field if it is bad."""
    if not isinstance(body, dict):
        raise invalid_request("request body must be a JSON object")
    for key in ("thinking", "metadata"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise invalid_request(f"{key}: must be an object")
    chat = {k: v for k, v in body.items() if k not in OWN and k not in DROPPED}
    chat["messages"] = convert_messages(body)
    if chat.get("max_tokens") is None:
        chat["max_tokens"] = DEFAULT_MAX_TOKENS
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise invalid_request("stop_sequences: must be a list of strings")
        chat["stop"] = stop
    thinking = body.get("thinking") or {}
    if thinking.get("type") == "enabled" and chat.get("reasoning_budget_tokens") is None:
        chat["reasoning_budget_tokens"] = thinking.get("budget_tokens", 10000)  # llama-server's
    tools, forced = convert_tools(body)
    choice = body.get("tool_choice")
    parallel = not (isinstance(choice, dict) and choice.get("disable_parallel_tool_use"))
    grammars = ("grammar", "json_schema", "response_format")
    if tools and any(chat.get(k) is not None for k in grammars):
        raise invalid_request("Cannot specify grammar with tools")
    params = parse_body(MessagesRequest, chat)
    return Converted(params, tools, forced, parallel)
