"""What a chat template can show, found as llama.cpp finds it (common/jinja/caps.cpp): the
template runs on probe conversations whose values record how the template used them, and
each capability is read from those records.

A value is *used* when the template looks it up (a variable, an attribute or item of
another value), tests it (`is string`), calls a method or filter on it, or loops over it;
`tojson` and `string` use every value inside. A value also records which operations ran on
it (`test_is_string`, `selectattr`, `array_access` for an integer index or a loop...).
The probes and the reading of them are llama.cpp's, in its order; a probe the template
refuses (raises) counts as llama.cpp counts it. `TemplateCaps.to_map()` is what
llama-server reports as `/props` `chat_template_caps`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import jinja2

from loraserve.chat.caps_tracking import TRACKING, is_used, ops_on, run_probe, track


@dataclass(frozen=True)
class TemplateCaps:
    """llama.cpp's `jinja::caps` (defaults as there)."""

    supports_tools: bool = True
    supports_tool_calls: bool = True
    supports_system_role: bool = True
    supports_parallel_tool_calls: bool = True
    supports_preserve_reasoning: bool = False
    supports_reasoning_effort: bool = False
    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_object_arguments: bool = False

    def to_map(self) -> dict[str, bool]:
        """The capabilities by name, keys sorted (llama.cpp's `std::map`)."""
        return {f.name: getattr(self, f.name) for f in sorted(fields(self), key=lambda f: f.name)}


_TOOL = {
    "name": "tool",
    "type": "function",
    "function": {
        "name": "tool1",
        "description": "Tool description",
        "parameters": {
            "type": "object",
            "properties": {"arg": {"type": "string", "description": "Arg description"}},
            "required": ["arg"],
        },
    },
}


def _call(n: int, args: Any) -> dict[str, Any]:
    return {
        "id": f"call0000{n}",
        "type": "function",
        "function": {"name": "tool1", "arguments": args},
    }


def _tool_chat(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


def _preserve(enabled: bool) -> dict[str, bool]:
    return {
        "preserve_thinking": enabled,
        "clear_thinking": not enabled,
        "truncate_history_thinking": not enabled,
        "drop_thinking": not enabled,
    }


@lru_cache(maxsize=32)
def detect_caps(source: str) -> TemplateCaps:
    """The capabilities of the Jinja template `source` (llama.cpp's `caps_get`)."""
    try:
        t = TRACKING.from_string(source)
    except jinja2.TemplateError:
        return TemplateCaps()
    r: dict[str, bool] = {}
    marker = "STRING_MARKER"
    ok, msgs, _, out, _ = run_probe(t, [{"role": "user", "content": marker}], None, {})
    content = msgs[0]["content"]
    checks_for_string = "test_is_string" in ops_on(content)
    as_array = bool(ops_on(content) & {"selectattr", "array_access"})
    if as_array:
        r["supports_typed_content"] = True
    if not ok or (as_array and marker not in out):
        r["supports_string_content"] = False
    if checks_for_string:
        ok, msgs, _, _, _ = run_probe(t, [{"role": "user", "content": []}], None, {})
        if ok and ops_on(msgs[0]["content"]) & {"selectattr", "array_access"}:
            r["supports_typed_content"] = True

    system = [
        {"role": "system", "content": "System message"},
        {"role": "user", "content": "User message"},
    ]
    _, msgs, _, _, _ = run_probe(t, system, None, {})
    if not is_used(msgs[0]["content"]):
        r["supports_system_role"] = False

    ok, msgs, tools, _, _ = run_probe(t, _tool_chat([_call(1, {"arg": "value"})]), [_TOOL], {})
    object_args = False
    if ok:
        if not is_used(tools[0]["function"]["name"]):
            r["supports_tools"] = False
        calls = msgs[1]["tool_calls"]
        if not is_used(calls):
            r["supports_tool_calls"] = False
        elif is_used(calls[0]["function"]["arguments"]["arg"]):
            object_args = r["supports_object_arguments"] = True
    if not object_args:
        ok, msgs, tools, _, _ = run_probe(
            t, _tool_chat([_call(1, '{"arg": "value"}')]), [_TOOL], {}
        )
        if not ok:
            r["supports_tool_calls"] = r["supports_tools"] = False
        else:
            if not is_used(tools[0]["function"]["name"]):
                r["supports_tools"] = False
            if not is_used(msgs[1]["tool_calls"]):
                r["supports_tool_calls"] = False

    args: Any = {"arg": "value"} if object_args else '{"arg": "value"}'
    ok, msgs, _, _, _ = run_probe(t, _tool_chat([_call(1, args), _call(2, args)]), [_TOOL], {})
    if not ok or not is_used(msgs[1]["tool_calls"][1]["function"]):
        r["supports_parallel_tool_calls"] = False

    placeholder = "<REASONING_CONTENT_PLACEHOLDER>"
    history = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": placeholder},
        {"role": "user", "content": "User message"},
        {
            "role": "assistant",
            "content": "Assistant message",
            "reasoning_content": "Reasoning content",
        },
        {"role": "user", "content": "User message"},
    ]
    _, _, _, out, _ = run_probe(t, history, None, {"enable_thinking": True, **_preserve(True)})
    if placeholder in out:
        r["supports_preserve_reasoning"] = True

    low = track("low")  # one value under both names, as llama.cpp binds them
    effort = {"enable_thinking": True, "reasoning_effort": low, "reasoning_strength": low}
    _, _, _, _, extra = run_probe(t, [{"role": "user", "content": "User message"}], None, effort)
    r["supports_reasoning_effort"] = is_used(extra["reasoning_effort"])
    return TemplateCaps(**r)
