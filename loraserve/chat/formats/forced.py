"""The notation a forced call (`tool_choice` required or a named function) is written in when
the template's detected format has no tool calls.

llama-server answers such a template plain content and constrains nothing (no tool format,
no grammar: common/chat-auto-parser-generator.cpp). loraserve forces the call, so it needs a
notation the parser reads back, taken from the template itself where it has one:

1. The calls the template writes when llama.cpp's fix-ups are left out: DeepSeek R1 Distill
   Llama 8B writes `<｜tool▁calls▁begin｜>..` only for an assistant message whose content is
   null and whose arguments are a string, which the analyser's probes (content "", arguments
   objects, as llama.cpp's) never are. The differential analysis over such raw renders finds
   the same description as R1 Distill Qwen's.
2. The call form the template's instructions describe ("respond only with <|tool_call|>
   followed by a JSON list of tools used": Granite 3.3, which renders no call at all).
3. Else None: the template neither renders nor describes a call (SmolLM3's Unsloth template,
   Gemma 2, Phi 3.5, RWKV World); the caller then uses bare JSON calls
   (`{"name": .., "arguments": ..}`), the form llama.cpp's former generic format used.
"""

from __future__ import annotations

import json
import re
from typing import Any

from loraserve.chat.formats.analyze import Render
from loraserve.chat.formats.autoformat import analyze
from loraserve.chat.formats.description import ChatFormat

_DESCRIBED = re.compile(r"with (<\|?[A-Za-z_]+\|?>) followed by a JSON list")


def _raw_call(msg: dict[str, Any]) -> dict[str, Any]:
    """A call message as a client may send it: content null, arguments a JSON string."""
    if not msg.get("tool_calls"):
        return msg
    calls = [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
        for c in msg["tool_calls"]
    ]
    return {**msg, "content": msg.get("content") or None, "tool_calls": calls}


def forced_call_format(fmt: ChatFormat, source: str, raw_render: Render) -> ChatFormat | None:
    """The format a forced call is written and parsed in for a template whose detected
    format `fmt` has no tool calls; None when the template shows none (bare JSON then).
    `raw_render` renders messages without llama.cpp's message fix-ups."""
    if fmt.has_tools:
        return fmt

    def render(msgs: list[dict[str, Any]], tools: Any, add_gen: bool, thinking: bool) -> str:
        return raw_render([_raw_call(m) for m in msgs], tools, add_gen, thinking)

    try:
        found = analyze(render, source)
    except Exception:  # noqa: BLE001 - a template the raw probes break shows no call form
        found = None
    if found is not None and found.has_tools:
        return found
    m = _DESCRIBED.search(source)
    if m is not None:
        marker = m.group(1)
        return fmt.with_(
            tool_mode="json",
            section_start=marker,
            array_wrapped=True,
            preserved_tokens=(*fmt.preserved_tokens, marker),
        )
    return None


def template_forced_format(fmt: ChatFormat, source: str, tokens: Any) -> ChatFormat | None:
    """`forced_call_format` for the Jinja template `source` rendered with the special
    tokens `tokens` (`render.Tokens`), its probes rendered as given (no message fix-ups)."""
    from loraserve.chat.render import RenderInputs, direct_apply
    from loraserve.chat.special import patch_source

    src = patch_source(source)

    def raw(msgs: list[dict[str, Any]], tools: Any, add_gen: bool, thinking: bool) -> str:
        inp = RenderInputs(msgs, tools=tools, add_generation_prompt=add_gen,
                           enable_thinking=thinking)  # fmt: skip
        return direct_apply(src, tokens, msgs, tools, inp, add_gen)

    return forced_call_format(fmt, source, raw)
