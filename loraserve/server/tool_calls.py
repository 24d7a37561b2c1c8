"""How one chat request's answer is read and constrained: the template's chat format
(`chat.formats`), the parser of the answer (content, `reasoning_content`, tool calls) and
the tool-call grammar, shared by /v1/chat/completions, /v1/messages and /v1/responses.

`tool_choice` here is "auto", "required", "none" or a function's name. Tools with a
choice other than "none" are parsed in the template's own format; a template whose format
has no tool calls answers plain content under "auto" (one warning at detection), and
under "required" or a named function gets the calls the template writes or describes
outside llama.cpp's detection (`chat.formats.forced`: R1 Distill Llama's DeepSeek calls,
Granite 3.3's `<|tool_call|>[..]`), else bare JSON calls (`{"name": .., "arguments": ..}`)
where the template shows no call form at all, so a forced call works with any template.
A grammar (`grammar`, `json_schema`, `response_format`) together with active tools is a
400, as in llama-server.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any

from loraserve.chat.formats.budget import forced_call_budget
from loraserve.chat.formats.description import PLAIN, ChatFormat
from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.lead import closes_reasoning, opens_reasoning, turn_lead
from loraserve.chat.formats.parse import ChatParser
from loraserve.chat.formats.stream import MessageStream
from loraserve.chat.messages import render_content
from loraserve.chat.render import select_source
from loraserve.chat.template import token_strings
from loraserve.engine.budget import BudgetSpec
from loraserve.engine.constraint import GrammarSpec
from loraserve.model.tokenizer import Tokenizer
from loraserve.server.errors import invalid_request
from loraserve.server.generation import off_loop, tokenize_prompt
from loraserve.server.grammar import AnswerConstraint, request_grammar
from loraserve.server.reasoning_budget import Budget, budget_spec
from loraserve.server.state import ServerState

BARE_JSON = ChatFormat(detector="bare_json", tool_mode="json")
"""Calls as bare JSON objects: the forced form for templates with no tool-call format."""

log = logging.getLogger(__name__)
_warned: set[int] = set()  # templates warned about having no tool-call format


def _warn_no_tool_format(state: ServerState) -> None:
    """One warning per template: tools were given, but its format has no tool calls."""
    key = hash(state.template().source)
    if key not in _warned:
        _warned.add(key)
        log.warning(
            "chat template: no tool-call format found in it; with tools, tool_choice auto "
            "answers plain content, required or a named function force a call in the "
            "notation it describes, else bare JSON"
        )


def tool_choice_of(tools: list[dict[str, Any]] | None, choice: Any) -> str:
    """OpenAI's `tool_choice` as "auto" / "required" / "none" / a function's name (default:
    "auto" with tools, "none" without)."""
    if isinstance(choice, dict):
        return str((choice.get("function") or {}).get("name") or choice.get("name") or "")
    if choice is None:
        return "auto" if tools else "none"
    return str(choice)


@dataclass
class ReplyPlan:
    """What reads (and constrains) one request's answer."""

    fmt: ChatFormat
    tools: list[dict[str, Any]] | None  # the callable tools (None: calls are not parsed)
    choice: str
    reasoning_format: str
    thinking_open: bool
    lead: str = ""  # the turn's start the prompt already wrote, parsed with the answer
    lark: str | None = None  # the tool-call grammar (llguidance Lark text)
    grammar: str | None = None  # ... compiled for the engine
    budget: BudgetSpec | None = None  # the reasoning budget (`engine.budget`)
    response_format: bool = False  # a JSON answer was asked for (```json fences unwrapped)
    continuation: bool = False  # the prompt continues the last assistant message

    @property
    def parses(self) -> bool:
        """Whether the answer is parsed (else it is plain content)."""
        return (
            self.tools is not None
            or self.response_format
            or bool(self.lead)
            or (self.reasoning_format != "none" and self.fmt.reasoning_mode != "none")
        )

    def parser(self, stream: bool = False) -> ChatParser:
        """A parser of one answer (deepseek-legacy keeps reasoning inline in streams)."""
        rf = self.reasoning_format
        if stream and rf == "deepseek-legacy":
            rf = "none"
        opened = self.thinking_open and not self.lead
        return ChatParser(self.fmt, self.tools, rf, opened, self.lead,  # type: ignore[arg-type]
                          self.response_format)  # fmt: skip

    def reader(self, stream: bool = True, id_prefix: str = "call_") -> MessageStream:
        """The deltas of one answer (a continued message's prefill is not sent again)."""
        return MessageStream(self.parser(stream), id_prefix, self.continuation and stream)

    async def engine_grammar(self, state: ServerState, params: Any) -> AnswerConstraint | None:
        """What the engine gets: the tool-call grammar, else the request's own (`grammar`,
        `json_schema`, `response_format`), with the reasoning budget; None when there is
        neither a budget nor a tool-call grammar (`submit` then compiles the request's own)."""
        if self.budget is None and self.grammar is None:
            return None
        grammar = self.grammar
        if grammar is None:
            grammar = await request_grammar(
                state, params.grammar, params.json_schema, params.response_format
            )
        return AnswerConstraint(grammar, self.budget)


def continues(cfg: Any, body: Any) -> str | None:
    """The text of the last assistant message when the request continues it, as
    `chat_prompt` decides (an explicit `continue_final_message`, else the prefill of a last
    assistant message); None when it does not."""
    msgs = getattr(body, "messages", None) or []
    last = msgs[-1] if msgs else None
    role = last.get("role") if isinstance(last, dict) else getattr(last, "role", None)
    cont = getattr(body, "continue_final_message", None)
    if cont is None:
        cont = bool(getattr(cfg, "prefill_assistant", True))
    if not cont or role != "assistant":
        return None
    content = last.get("content") if isinstance(last, dict) else getattr(last, "content", None)
    if isinstance(content, list):
        parts = [p if isinstance(p, dict) else vars(p) for p in content]
        content = render_content({"content": [p for p in parts if "text" in p]})
    return content if isinstance(content, str) else ""


def is_response_format(constrained: tuple[str, Any] | None) -> bool:
    """Whether a request's constraint (`grammar_spec`'s answer) asks for a JSON answer."""
    return constrained is not None and constrained[0] != "grammar"


def _special(tok: Tokenizer):  # noqa: ANN202 - Callable[[str], bool]
    def special(marker: str) -> bool:
        ids = tok.encode(marker, add_special=False, parse_special=True)
        return len(ids) == 1 and ids != tok.encode(marker, add_special=False, parse_special=False)

    return special


def chat_format(state: ServerState, tools: list[dict[str, Any]] | None) -> ChatFormat:
    """The server template's format (for the variant `tools` select); PLAIN for a built-in."""
    template = state.template()
    if template.builtin:
        return PLAIN
    source = select_source(template.source, template.tool_use, tools)
    fmt = template.chat_format(source, token_strings(state.require().tokenizer))
    return fmt if isinstance(fmt, ChatFormat) else PLAIN


def forced_format(state: ServerState, tools: list[dict[str, Any]] | None) -> ChatFormat | None:
    """The notation a forced call is written in where the template's format has no tool
    calls (`chat.formats.forced`: the calls it writes or describes); None: bare JSON."""
    template = state.template()
    if template.builtin:
        return None
    source = select_source(template.source, template.tool_use, tools)
    fmt = template.forced_format(source, token_strings(state.require().tokenizer))
    return fmt if isinstance(fmt, ChatFormat) else None


async def plan_reply(
    state: ServerState,
    prompt: str,
    tools: list[dict[str, Any]] | None,
    choice: str,
    parallel: bool = True,
    reasoning_format: str | None = None,
    has_grammar: bool = False,
    budget: Budget | int = -1,
    response_format: bool = False,
    continuation: str | bool | None = None,
) -> ReplyPlan:
    """The plan of one request: its format, parser settings, compiled tool grammar and
    reasoning budget (`budget`, or its tokens; -1: none, but a forced call with reasoning
    before it gets `forced_call_budget`); a 400 for a grammar with active tools or a named
    function missing from `tools`. `response_format`: a JSON answer was asked for
    (`json_schema`, `response_format`), whose ```json fences the parser unwraps;
    `continuation`: the continued assistant message's text (`continues`), None when none."""
    cfg = state.cfg
    fmt = await asyncio.to_thread(chat_format, state, tools)
    rf = reasoning_format or getattr(cfg, "reasoning_format", "auto")
    active = tools if tools and choice != "none" else None
    if active and has_grammar:  # llama-server checks it before --skip-chat-parsing too
        raise invalid_request("Cannot specify grammar with tools")
    if getattr(cfg, "skip_chat_parsing", False):
        return ReplyPlan(PLAIN, None, "none", "none", False)
    if active and choice not in ("auto", "required"):
        if not any(t["function"]["name"] == choice for t in active):
            raise invalid_request(f"tool_choice: no function named {choice!r} in tools")
    if active and not fmt.has_tools:
        _warn_no_tool_format(state)
        if choice == "auto":
            active = None
        else:
            fmt = await asyncio.to_thread(forced_format, state, tools) or BARE_JSON.with_(
                reasoning_mode=fmt.reasoning_mode,
                reasoning_start=fmt.reasoning_start,
                reasoning_end=fmt.reasoning_end,
            )
    thinking_open = rf != "none" and opens_reasoning(fmt, prompt)
    continued = continuation if isinstance(continuation, str) else ""
    lead = turn_lead(fmt, prompt, continued)  # parsed with the answer, as in llama.cpp
    trigger = fmt.trigger.strip()
    if not lead and trigger and prompt.rstrip().endswith(trigger):  # no assistant marker
        lead = trigger  # (Mistral's turns): a prefill that wrote the trigger
    cont = continuation is not None and continuation is not False
    plan = ReplyPlan(fmt, active, choice, rf, thinking_open, lead, continuation=cont)
    engine = state.require()
    tok = engine.tokenizer
    budget = Budget(budget) if isinstance(budget, int) else budget
    started = bool(trigger) and lead.rstrip().endswith(trigger)  # a prefill wrote it
    opened = opens_reasoning(fmt, prompt)  # the model ends it whatever the parser reads
    # a forced call may follow one block the answer opens (llama.cpp: reasoning? calls)
    own_block = rf != "none" and not closes_reasoning(fmt, prompt)
    if active and choice != "auto" and budget.tokens < 0 and (opened or own_block) and not started:
        n = len(await off_loop(lambda: tokenize_prompt(tok, prompt), len(prompt)))
        left = engine.n_ctx_slot - n  # no budget set: the call keeps half the room
        budget = replace(budget, tokens=forced_call_budget(budget.allowance, left))
    plan.budget = budget_spec(tok, fmt, prompt, budget)
    plan.response_format = response_format and not active
    if active:
        for special in (_special(tok), lambda m: False):  # then: every marker as text
            plan.lark = tool_grammar(fmt, active, choice, parallel, own_block, opened,
                                     special, started)  # fmt: skip
            if plan.lark is None:
                break
            try:
                spec = GrammarSpec("lark", plan.lark)
                plan.grammar = await asyncio.to_thread(engine.compile_grammar, spec)
                break
            except ValueError as e:
                error = e
        else:
            raise invalid_request(f"tools: the tool-call grammar is invalid: {error}")
    return plan
