"""A request's chat prompt: the server's template (`template.ChatTemplate`) with the request's
options as llama-server reads them (server-common.cpp, `oaicompat_chat_params_parse`):
`--chat-template-kwargs` updated by the request's `chat_template_kwargs`, `enable_thinking`
from `--reasoning` (on, off, or auto: whether the template supports thinking), then the
kwargs' `enable_thinking` (a JSON boolean; a string is refused) and `reasoning_effort`
("none" turns thinking off; another value is passed to the template as a kwarg). A request
the template or these rules refuse is a ValueError naming why (the server answers it as a
400: `server.chat_prompt`), so the chat package does not depend on the server's."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from loraserve.chat.render import Continuation, Tokens
from loraserve.chat.template import ChatTemplate, Reasoning, token_strings
from loraserve.model.tokenizer import Tokenizer


def thinking_kwarg(kwargs: dict[str, Any]) -> bool | None:
    """The `enable_thinking` template kwarg as llama-server reads it: a JSON boolean, else
    None; a string is a ValueError (a 400 at the server)."""
    if "enable_thinking" not in kwargs:
        return None
    v = kwargs["enable_thinking"]
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        raise ValueError('invalid type for "enable_thinking" (expected boolean, got string)')
    return None


def render_prompt(
    template: ChatTemplate,
    tok: Tokenizer | Tokens,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    defaults: dict[str, Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tools: list[dict[str, Any]] | None = None,
    continuation: Continuation = "none",
    reasoning: Reasoning = "auto",
    reasoning_effort: str | None = None,
    now: datetime | None = None,
    pure_content: bool = False,
) -> str:
    """The chat prompt from the server's template, with the template kwargs `defaults`
    (`--chat-template-kwargs`) updated by the request's `kwargs`, `enable_thinking` from
    `reasoning` (`--reasoning`) and the template, then the kwargs and `reasoning_effort`;
    a ValueError naming the problem when the messages or the template fail. `now`: the time the
    template shows (default: the local time). `pure_content` (`--skip-chat-parsing`): as
    llama-server's forced pure-content render (common/chat.cpp), a continued message is
    dropped, not prefilled: the messages before it are rendered with no generation prompt
    and nothing is appended (tests/data/chat/skip_parsing_server.json)."""
    if pure_content and continuation != "none":
        messages, add_generation_prompt, continuation = messages[:-1], False, "none"
    merged = {**(defaults or {}), **(kwargs or {})}
    thinking = {"on": True, "off": False}.get(reasoning)  # auto: whether the template thinks
    if (kw := thinking_kwarg(merged)) is not None:
        thinking = kw
    if reasoning_effort == "none":
        thinking = False
        merged.pop("reasoning_effort", None)
    elif reasoning_effort:
        merged["reasoning_effort"] = reasoning_effort
    if thinking is None:
        tokens = tok if isinstance(tok, Tokens) else token_strings(tok)
        thinking = template.supports_thinking(tokens, tools)
    return template.render(
        tok, messages, add_generation_prompt, merged, tools=tools,
        continuation=continuation, enable_thinking=thinking, now=now,
    )  # fmt: skip
