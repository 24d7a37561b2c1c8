"""Chat messages and tools as llama-server hands them to a Jinja template (common/chat.cpp).

`parse_messages` reads OpenAI messages as `common_chat_msgs_parse_oaicompat` does and writes
them back as `common_chat_msg::to_json_oaicompat` does: only `role`, `content` (a string, ""
when absent or null, or the typed text parts), `reasoning_content`, `name`, `tool_call_id`
and `tool_calls` (`type`, `function` {`name`, `arguments` as a JSON string}, `id`), in that
order; the template sees nothing else. `parse_tools` rebuilds each tool the same way
(`type`, `function` {`name`, `description`, `parameters`}).

`fix_messages` then applies llama.cpp's fix-ups for what the template can show
(`caps.TemplateCaps`): contents as strings or as typed parts, `developer` as `system`
(not for gpt-oss, whose template knows it), a first system message merged into the next
one where the template has no system role, tool-call arguments as objects where the
template reads their fields.

`normalize_messages` checks a request's `messages` field before any of that (a 400 names
the message), and `flat_messages` joins typed parts for the built-in templates.
"""

from __future__ import annotations

import json
from typing import Any

from loraserve.chat.caps import TemplateCaps

Msg = dict[str, Any]


def _text_parts(parts: list[Any], where: str) -> list[dict[str, str]]:
    out = []
    for j, part in enumerate(parts):
        here = f"{where}.content[{j}]"
        if not isinstance(part, dict) or "type" not in part:
            raise ValueError(f"{here}: Missing content part type")
        if part["type"] not in ("text", "media_marker"):
            raise ValueError(f"{here}: Unsupported content part type: {json.dumps(part['type'])}")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{here}.text: must be a string")
        out.append({"type": part["type"], "text": part["text"]})
    return out


def _tool_call(tc: Any, where: str) -> dict[str, Any]:
    if not isinstance(tc, dict) or "type" not in tc:
        raise ValueError(f"{where}: Missing tool call type")
    if tc["type"] != "function":
        raise ValueError(f"{where}: Unsupported tool call type: {json.dumps(tc['type'])}")
    fn = tc.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"{where}: Missing tool call function")
    if not isinstance(fn.get("name"), str):
        raise ValueError(f"{where}.function: Missing tool call name")
    if "arguments" not in fn:
        raise ValueError(f"{where}.function: Missing tool call arguments")
    args = fn["arguments"]
    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    out: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(tc.get("id"), str) and tc["id"]:
        out["id"] = tc["id"]
    return out


def parse_messages(messages: Any) -> list[Msg]:
    """OpenAI chat messages as llama.cpp's template sees them (see the module docstring);
    ValueError naming the message that is malformed."""
    if not isinstance(messages, list):
        raise ValueError("messages: expected a list of messages")
    out: list[Msg] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ValueError(f"{where}: expected an object with 'role' and 'content'")
        role = msg.get("role")
        if not isinstance(role, str):
            raise ValueError(f"{where}.role: missing" if role is None else f"{where}.role: "
                             f"must be a string, got {type(role).__name__}")  # fmt: skip
        if "content" not in msg and "tool_calls" not in msg:
            raise ValueError(f"{where}: Expected 'content' or 'tool_calls'")
        content = msg.get("content")
        jmsg: Msg = {"role": role}
        if isinstance(content, list) and content:
            jmsg["content"] = _text_parts(content, where)
        elif isinstance(content, str) or content is None or content == []:
            jmsg["content"] = content or ""
        else:
            raise ValueError(f"{where}.content: must be a string or a list of content parts")
        if isinstance(msg.get("reasoning_content"), str) and msg["reasoning_content"]:
            jmsg["reasoning_content"] = msg["reasoning_content"]
        for key in ("name", "tool_call_id"):
            if isinstance(msg.get(key), str) and msg[key]:
                jmsg[key] = msg[key]
        calls = msg.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise ValueError(f"{where}.tool_calls: expected a list")
        if calls:
            jmsg["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in
                                  enumerate(calls)]  # fmt: skip
        out.append(jmsg)
    return out


def parse_tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI function tools as llama.cpp shows them; None when there are none (an empty
    list shows no tools either)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools: expected a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ValueError(f"tools[{i}]: Unsupported tool type (only 'function')")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tools[{i}].function: Missing tool function name")
        params = fn.get("parameters")
        desc = fn.get("description")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": desc if isinstance(desc, str) else "",
                    "parameters": params if params is not None else {},
                },
            }
        )
    return out or None


def concat_parts(parts: list[dict[str, str]]) -> str:
    """Typed parts as one string: text parts joined by newlines, none around media markers
    (llama.cpp's `concat_content_parts`)."""
    text, last_media = "", False
    for part in parts:
        if part["type"] == "text":
            if text and not last_media:
                text += "\n"
            last_media = False
        else:
            last_media = True
        text += part["text"]
    return text


def render_content(msg: Msg, delimiter: str = "\n\n") -> str:
    """A message's text, its text parts joined by `delimiter` (`common_chat_msg::render_content`,
    what a continued assistant message adds after the generation prompt)."""
    content = msg.get("content", "")
    if isinstance(content, str):
        return content
    return delimiter.join(p["text"] for p in content if p["type"] == "text")


def fix_messages(msgs: list[Msg], caps: TemplateCaps, source: str) -> list[Msg]:
    """llama.cpp's fix-ups before rendering with a template of these capabilities (see the
    module docstring). ValueError when tool-call arguments must be objects and are not JSON."""
    only_string = caps.supports_string_content and not caps.supports_typed_content
    only_typed = caps.supports_typed_content and not caps.supports_string_content
    out = []
    for msg in msgs:
        m = dict(msg)
        content = m.get("content")
        if only_typed and isinstance(content, str):
            m["content"] = [{"type": "text", "text": content}]
        elif only_string and isinstance(content, list):
            m["content"] = concat_parts(content)
        out.append(m)
    if "<|channel|>" not in source:
        for m in out:
            if m["role"] == "developer":
                m["role"] = "system"
    if not caps.supports_system_role and out and out[0]["role"] == "system":
        first = out.pop(0)
        if out:
            if not isinstance(first["content"], str) or not isinstance(out[0]["content"], str):
                raise ValueError("messages[0]: the template has no system role, and a system "
                                 "message with content parts cannot be merged")  # fmt: skip
            out[0] = {**out[0], "content": first["content"] + "\n" + out[0]["content"]}
    if caps.supports_object_arguments:
        for m in out:
            if "tool_calls" not in m:
                continue
            calls = []
            for tc in m["tool_calls"]:
                args = tc["function"]["arguments"]
                try:
                    parsed = json.loads(args) if isinstance(args, str) else args
                except json.JSONDecodeError as e:
                    raise ValueError(f"Failed to parse tool call arguments as JSON: {e}") from None
                calls.append({**tc, "function": {**tc["function"], "arguments": parsed}})
            m["tool_calls"] = calls
    return out


def _check_parts(parts: list[Any], where: str) -> list[dict[str, str]]:
    out = []
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
        out.append({"type": "text", "text": part["text"]})
    return out


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Check chat messages (a request's `messages` field).

    Each message needs a string `role`, and a `content` that is a string or a list of
    `{"type": "text", "text": ...}` parts (kept as parts: a template may show them); an
    assistant message may have a null or missing content (it becomes ""). Other keys are
    kept. Raises ValueError naming the message.
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
            content = _check_parts(content, where)
        elif not isinstance(content, str):
            raise ValueError(f"{where}.content: must be a string or a list of content parts")
        out.append({**msg, "content": content})
    return out


def flat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with list-of-parts contents joined by newlines (llama.cpp's built-in
    templates see text only)."""
    return [
        {**m, "content": concat_parts(m["content"])} if isinstance(m.get("content"), list) else m
        for m in normalize_messages(messages)
    ]
