"""Chat prompts from a model's Jinja2 chat template, as llama.cpp's `--jinja` path renders them.

The template runs in jinja2's `ImmutableSandboxedEnvironment` with `trim_blocks` and
`lstrip_blocks` on (llama.cpp's and transformers' settings) and the helpers chat templates
expect: `raise_exception`, `strftime_now`, a `tojson` filter writing Python `json.dumps`
style (no HTML escaping, non-ASCII kept), `bos_token`, `eos_token`, `add_generation_prompt`.

Which template a server renders with (`resolve_chat_template`), as llama-server resolves it:
`--chat-template` (one of llama.cpp's built-in names, rendered by `chat_builtin` as its C++
code does, or Jinja text), `--chat-template-file` (Jinja), else the model file's template.
A model without one gets llama.cpp's fallback, the ChatML template of common/chat.cpp
(`CHATML_TEMPLATE`, the same text), with a warning at start; **ours:** a vocabulary with
Gemma's turn tokens (`<start_of_turn>`, `<end_of_turn>`) and no template (Gemma 3 270M
base) gets the built-in `gemma` instead, since ChatML's markers are plain text to it.
Jinja templates get `chat_template_kwargs` (`--chat-template-kwargs`, then the request's)
as extra variables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from loraserve.chat.builtin import BUILTIN, UNPORTED, render_builtin
from loraserve.model.tokenizer import Tokenizer
from loraserve.server.errors import invalid_request

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)


class ChatTemplateError(ValueError):
    """The template does not compile, or refused the messages (its `raise_exception`)."""


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(f"chat template error: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile (once per source text) a chat template; `ChatTemplateError` if it is invalid."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from None


def _flatten(parts: list[Any], where: str) -> str:
    """Text parts joined by newlines, as llama.cpp's `concat_content_parts`."""
    text = ""
    for j, part in enumerate(parts):
        here = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            raise ValueError(f"{here}: expected an object like {{'type': 'text', 'text': ...}}")
        if part.get("type") != "text":
            raise ValueError(
                f"{here}: unsupported content part type {part.get('type')!r} (text only)"
            )
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{here}.text: must be a string")
        text += ("\n" if text else "") + part["text"]
    return text


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Check chat messages and flatten list-of-parts contents to text.

    Each message needs a string `role`, and a `content` that is a string or a list of
    `{"type": "text", "text": ...}` parts; an assistant message may have a null or missing
    content (it becomes ""). Other keys are kept. Raises ValueError naming the message.
    """
    if not isinstance(messages, list):
        raise ValueError("messages: expected a list of messages")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ValueError(f"{where}: expected an object with 'role' and 'content'")
        role = msg.get("role")
        if role is None:
            raise ValueError(f"{where}.role: missing")
        if not isinstance(role, str):
            raise ValueError(f"{where}.role: must be a string, got {type(role).__name__}")
        content = msg.get("content")
        if content is None:
            if role != "assistant":
                raise ValueError(f"{where}.content: missing (required for role {role!r})")
            content = ""
        elif isinstance(content, list):
            content = _flatten(content, where)
        elif not isinstance(content, str):
            raise ValueError(f"{where}.content: must be a string or a list of content parts")
        out.append({**msg, "content": content})
    return out


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
) -> str:
    """Render `messages` into a prompt string with `template` (ChatML when None or empty).

    `add_bos` / `add_eos`: the tokenizer will add BOS / EOS itself, so a leading BOS / a
    trailing EOS the template wrote is removed (llama.cpp does the same, so Gemma's
    `{{ bos_token }}` does not end up twice). Raises ValueError on malformed messages and
    `ChatTemplateError` (a ValueError) when the template fails or refuses them.
    `kwargs` are extra template variables (they cannot replace the four above).
    """
    source = CHATML_TEMPLATE if not template or template == "chatml" else template
    msgs = normalize_messages(messages)
    try:
        result = compile_template(source).render(
            **(kwargs or {}),
            messages=msgs,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except ChatTemplateError:
        raise
    except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
        raise ChatTemplateError(f"chat template error: {type(exc).__name__}: {exc}") from None
    if add_bos and bos_token and result.startswith(bos_token):
        result = result[len(bos_token) :]
    if add_eos and eos_token and result.endswith(eos_token):
        result = result[: -len(eos_token)]
    return result


@dataclass(frozen=True)
class ChatTemplate:
    """The template a server renders chats with: a built-in name (`builtin`) or Jinja text,
    and where it came from (`origin`: a flag, "model" or "fallback")."""

    source: str
    builtin: bool
    origin: str

    def render(
        self,
        tok: Tokenizer,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text; ValueError naming the problem (messages, or the template)."""
        if self.builtin:
            return render_builtin(self.source, normalize_messages(messages), add_generation_prompt)
        bos = tok.piece(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.piece(tok.eos_id) if tok.eos_id is not None else ""
        return render_chat(
            self.source,
            messages,
            bos,
            eos,
            add_generation_prompt,
            add_bos=tok.add_bos,
            add_eos=tok.add_eos,
            kwargs=kwargs,
        )


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
    override: str | None, origin: str, tok: Tokenizer
) -> tuple[ChatTemplate, str | None]:
    """The server's template and, when the model has none, the warning to log at start.

    `override` is `--chat-template`'s value or `--chat-template-file`'s text (`origin`
    names the flag); without it, the model's own template; else the fallback."""
    if override is not None:
        if origin == "--chat-template":
            return check_template_flag(override), None
        compile_template(override)
        return ChatTemplate(override, False, origin), None
    if tok.chat_template:
        return ChatTemplate(tok.chat_template, False, "model"), None
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


def render_prompt(
    template: ChatTemplate,
    tok: Tokenizer,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    defaults: dict[str, Any] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> str:
    """The chat prompt from the server's template, with the model's BOS and EOS and the
    template variables `defaults` (`--chat-template-kwargs`) updated by the request's
    `kwargs`; a 400 naming the problem when the messages or the template fail."""
    try:
        return template.render(
            tok, messages, add_generation_prompt, {**(defaults or {}), **(kwargs or {})}
        )
    except ValueError as e:
        raise invalid_request(str(e)) from None
