"""Chat prompts from a model's chat template, as llama-server (`--jinja`) renders them.

Which template a server renders with (`resolve_chat_template`), as llama-server resolves it:
`--chat-template` (one of llama.cpp's built-in names, rendered by `builtin` as its C++
code does, or Jinja text), `--chat-template-file` (Jinja), else the model file's template
(and its `tool_use` variant, used when a request has tools). A model without one gets
llama.cpp's fallback, the ChatML template of common/chat.cpp (`CHATML_TEMPLATE`, the same
text), with a warning at start; **ours:** a vocabulary with Gemma's turn tokens
(`<start_of_turn>`, `<end_of_turn>`) and no template (Gemma 3 270M base) gets the built-in
`gemma` instead, since ChatML's markers are plain text to it.

A Jinja template renders through `render.render` (llama.cpp's steps and variables) in the
environment of `jinja_env` (llama.cpp's engine's semantics); its capabilities (`caps`) and
its format (`formats.detect`: the reasoning markers, whether it supports thinking) are found
once per template. `enable_thinking` defaults to `--reasoning` (auto: on where the template
supports thinking), and a request's `chat_template_kwargs` `enable_thinking` (a JSON
boolean) or `reasoning_effort: "none"` overrides it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from loraserve.chat.builtin import BUILTIN, UNPORTED, render_builtin
from loraserve.chat.caps import TemplateCaps, detect_caps
from loraserve.chat.jinja_env import ChatTemplateError, compile_template
from loraserve.chat.messages import flat_messages, normalize_messages
from loraserve.chat.render import (
    Continuation,
    RenderInputs,
    Tokens,
    render,
    select_source,
    supports_thinking_by_render,
)
from loraserve.chat.special import find as find_special
from loraserve.chat.special import patch_source
from loraserve.model.tokenizer import Tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplate",
    "ChatTemplateError",
    "compile_template",
    "flat_messages",
    "normalize_messages",
]
log = logging.getLogger("loraserve.server")

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)
Reasoning = Literal["on", "off", "auto"]


def render_chat(
    template: str | None,
    messages: list[dict[str, Any]],
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    *,
    add_bos: bool = False,
    add_eos: bool = False,
    kwargs: dict[str, Any] | None = None,
    enable_thinking: bool = True,
) -> str:
    """Render `messages` with the Jinja `template` (ChatML when None, empty or "chatml") as
    llama-server does, without tools or continuation (see `render.render`).

    `add_bos` / `add_eos`: the tokenizer adds BOS / EOS itself, so a leading BOS / a
    trailing EOS the template wrote is removed. Raises ValueError on malformed messages and
    `ChatTemplateError` (a ValueError) when the template fails or refuses them. `kwargs` are
    extra template variables (JSON values)."""
    source = CHATML_TEMPLATE if not template or template == "chatml" else template
    tokens = Tokens(bos_token, eos_token, add_bos, add_eos)
    inputs = RenderInputs(
        normalize_messages(messages),
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        kwargs=dict(kwargs or {}),
    )
    return render(source, tokens, inputs)


@dataclass(frozen=True)
class ChatTemplate:
    """The template a server renders chats with: a built-in name (`builtin`) or Jinja text,
    where it came from (`origin`: a flag, "model" or "fallback"), and the model's `tool_use`
    variant (Jinja, used for requests with tools)."""

    source: str
    builtin: bool
    origin: str
    tool_use: str | None = None
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def caps(self) -> TemplateCaps:
        """The capabilities llama-server reports (the `tool_use` variant's when there is one)."""
        if self.builtin:
            return TemplateCaps()
        return detect_caps(self.tool_use or self.source)

    def chat_format(self, source: str, tokens: Tokens) -> Any:
        """The format `formats.detect` finds for `source` (None when it cannot tell)."""
        if source not in self._cache:
            self._cache[source] = _detect_format(source, tokens)
        return self._cache[source]

    def forced_format(self, source: str, tokens: Tokens) -> Any:
        """The format a forced call is written in where `chat_format` has no tool calls
        (`formats.forced`; None: the template shows no call form, bare JSON is forced)."""
        key = "forced:" + source
        if key not in self._cache:
            from loraserve.chat.formats.forced import template_forced_format

            fmt = self.chat_format(source, tokens)
            self._cache[key] = None if fmt is None else template_forced_format(fmt, source, tokens)
        return self._cache[key]

    def supports_thinking(self, tokens: Tokens, tools: Any = None) -> bool:
        """Whether the template knows reasoning (llama-server's `supports_thinking`)."""
        if self.builtin:
            return False
        source = patch_source(select_source(self.source, self.tool_use, tools))
        spec = find_special(source)
        if spec is not None:
            return spec.supports_thinking
        fmt = self.chat_format(source, tokens)
        if fmt is not None:
            return bool(fmt.has_reasoning)
        key = "thinking:" + source
        if key not in self._cache:
            self._cache[key] = supports_thinking_by_render(source, tokens)
        return self._cache[key]

    def render(
        self,
        tok: Tokenizer | Tokens,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        kwargs: dict[str, Any] | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        continuation: Continuation = "none",
        enable_thinking: bool | None = None,
        now: datetime | None = None,
    ) -> str:
        """The prompt text; ValueError naming the problem (messages, or the template).
        `tok`: the model's tokenizer (or its special tokens as `Tokens`); `enable_thinking`
        None: whether the template supports thinking."""
        if self.builtin:
            msgs = flat_messages(messages)
            if continuation != "none" and msgs:
                head = render_builtin(self.source, msgs[:-1], True)
                return head + msgs[-1]["content"]
            return render_builtin(self.source, msgs, add_generation_prompt)
        tokens = tok if isinstance(tok, Tokens) else token_strings(tok)
        source = select_source(self.source, self.tool_use, tools)
        fmt = self.chat_format(source, tokens)
        markers = (fmt.reasoning_start, fmt.reasoning_end) if fmt is not None else ("", "")
        if enable_thinking is None:
            enable_thinking = self.supports_thinking(tokens, tools)
        inputs = RenderInputs(
            normalize_messages(messages),
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continuation=continuation,
            enable_thinking=enable_thinking,
            kwargs=dict(kwargs or {}),
            reasoning_markers=markers,
            now=now,
        )
        return render(source, tokens, inputs)


def token_strings(tok: Tokenizer) -> Tokens:
    """The tokenizer's BOS / EOS text and whether it adds them itself."""
    bos = tok.piece(tok.bos_id) if tok.bos_id is not None else ""
    eos = tok.piece(tok.eos_id) if tok.eos_id is not None else ""
    return Tokens(bos, eos, tok.add_bos, tok.add_eos)


def _detect_format(source: str, tokens: Tokens) -> Any:
    """`formats.detect.detect` over this renderer; None (with a log line) when the formats
    package cannot answer."""
    try:
        from loraserve.chat.formats.detect import detect
    except ImportError:
        return None

    def run(msgs: list, tools: list | None, add_gen: bool, thinking: bool) -> str:
        inputs = RenderInputs(msgs, tools=tools, add_generation_prompt=add_gen,
                              enable_thinking=thinking)  # fmt: skip
        return render(source, tokens, inputs)

    try:
        return detect(source, run)
    except Exception as e:  # noqa: BLE001 - rendering must not fail on the format's account
        log.warning(
            "chat format detection failed (%s: %s); no reasoning markers", type(e).__name__, e
        )
        return None


def check_template_flag(value: str) -> ChatTemplate:
    """`--chat-template VALUE`: a built-in name, or Jinja text that compiles; ValueError
    naming the problem (an unknown or unported name, a template that does not compile)."""
    if value in BUILTIN:
        return ChatTemplate(value, True, "--chat-template")
    if value in UNPORTED:
        raise ValueError(
            f"llama.cpp's built-in template {value!r} is not ported to loraserve; pass its "
            "Jinja text with --chat-template-file"
        )
    if "{{" not in value and "{%" not in value:
        raise ValueError(
            f"unknown built-in template {value!r} (and not Jinja text); built-in: "
            + ", ".join(sorted(BUILTIN))
        )
    compile_template(value)
    return ChatTemplate(value, False, "--chat-template")


def _is_single_token(tok: Tokenizer, text: str) -> bool:
    return len(tok.encode(text, add_special=False, parse_special=True)) == 1


def resolve_chat_template(
    override: str | None, origin: str, tok: Tokenizer, tool_use: str | None = None
) -> tuple[ChatTemplate, str | None]:
    """The server's template and, when the model has none, the warning to log at start.

    `override` is `--chat-template`'s value or `--chat-template-file`'s text (`origin`
    names the flag); without it, the model's own template (and `tool_use`, the model's
    `tokenizer.chat_template.tool_use`, which also stands in for a missing default); else
    the fallback."""
    if override is not None:
        if origin == "--chat-template":
            return check_template_flag(override), None
        compile_template(override)
        return ChatTemplate(override, False, origin), None
    if tool_use:
        try:
            compile_template(tool_use)
        except ChatTemplateError as e:
            log.error("the model's tool_use chat template is ignored: %s", e)
            tool_use = None
    if tok.chat_template and tok.chat_template != "chatml":
        return ChatTemplate(tok.chat_template, False, "model", tool_use), None
    if tool_use:
        return ChatTemplate(tool_use, False, "model", tool_use), None
    gemma = all(_is_single_token(tok, t) for t in ("<start_of_turn>", "<end_of_turn>"))
    chosen = (
        ChatTemplate("gemma", True, "fallback")
        if gemma
        else ChatTemplate(CHATML_TEMPLATE, False, "fallback")
    )
    name = "gemma (its vocabulary has Gemma's turn tokens)" if gemma else "chatml"
    warning = (
        f"the model has no chat template; chat uses the {name} fallback "
        "(choose one with --chat-template NAME or --chat-template-file FILE)"
    )
    return chosen, warning


def __getattr__(name: str) -> Any:
    """`render_prompt` and `thinking_kwarg` (in `prompt`), still importable from here."""
    if name in ("render_prompt", "thinking_kwarg"):
        from loraserve.chat import prompt

        return getattr(prompt, name)
    raise AttributeError(name)
