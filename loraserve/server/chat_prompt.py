"""A chat request's prompt, rendered as llama-server renders it (`chat.prompt`), with
llama-server's checks on a continued (prefilled) assistant message."""

from __future__ import annotations

from typing import Any

from loraserve.chat.prompt import render_prompt
from loraserve.server.errors import invalid_request
from loraserve.server.state import ServerState

CONTINUATION = {"content": "content", "reasoning_content": "reasoning"}


def chat_prompt(state: ServerState, body: Any, tools: list[dict[str, Any]] | None = None) -> str:
    """A chat request's prompt, rendered as llama-server renders it (`chat.template`):
    ``body``'s ``messages`` and ``tools`` (the argument, else the body's) with the server's
    template, ``add_generation_prompt``, the server's template kwargs updated by the
    request's ``chat_template_kwargs``, ``enable_thinking`` from ``--reasoning`` and the
    template, and the request's ``reasoning_effort``; chat completions, /apply-template,
    token counts, Responses and Anthropic Messages.

    As llama-server: a last assistant message is continued (prefilled: the others are
    rendered without the generation prompt, then the generation prompt and its text follow)
    unless ``--no-prefill-assistant`` or the request sets ``continue_final_message`` false;
    true asks for it explicitly and then needs ``add_generation_prompt`` false ("content"
    or "reasoning_content": continue that part of it, the reasoning left open). Two
    assistant messages at the end, or continuing one with tool calls, are 400s. Under
    ``--skip-chat-parsing`` the continued message is dropped, as llama-server drops it."""
    cfg = state.cfg
    messages = body.messages
    add_gen = body.add_generation_prompt
    cont = getattr(body, "continue_final_message", None)
    last_is_assistant = bool(messages) and messages[-1].get("role") == "assistant"
    if cont is None and cfg.prefill_assistant and last_is_assistant:
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise invalid_request(
                "messages: Cannot have 2 or more assistant messages at the end of the list."
            )
        cont, add_gen = True, False
    if cont and add_gen:
        raise invalid_request(
            "Cannot set both add_generation_prompt and continue_final_message to true."
        )
    if cont and last_is_assistant and messages[-1].get("tool_calls"):
        raise invalid_request("Cannot continue an assistant message that contains tool calls.")
    try:
        return render_prompt(
            state.template(),
            state.require().tokenizer,
            messages,
            add_gen,
            cfg.chat_template_kwargs,
            body.chat_template_kwargs,
            tools=tools if tools is not None else getattr(body, "tools", None),
            continuation=CONTINUATION.get(cont, "auto" if cont else "none"),  # type: ignore[arg-type]
            reasoning=cfg.reasoning,  # type: ignore[arg-type]
            reasoning_effort=_effort(cfg, body),
            pure_content=getattr(cfg, "skip_chat_parsing", False),
        )
    except ValueError as e:  # the messages, the kwargs or the template refused
        raise invalid_request(str(e)) from None


def _effort(cfg: Any, body: Any) -> str | None:
    """The request's `reasoning_effort`; "none" (thinking off) under a reasoning budget of 0
    (`reasoning_budget_tokens`, else `--reasoning-budget`)."""
    budget = getattr(body, "reasoning_budget_tokens", None)
    if budget is None:
        budget = getattr(cfg, "reasoning_budget", -1)
    return "none" if budget == 0 else getattr(body, "reasoning_effort", None)
