"""An assistant's generated text split into the parts of a chat message, as it streams:
reasoning (`<think>...</think>`), content, and tool calls.

llama-server parses a model's output with a parser derived from its chat template
(common/chat.cpp); **ours** recognises the two forms small models use: reasoning in
`<think>...</think>` at the start of the answer (or after a prompt that opened `<think>`),
and tool calls as Hermes/Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks. When the tools are forced (`tool_choice` any/tool), the whole answer is the JSON of
one call, constrained by `tool_call_schema`. Text that could still become a marker is held
back until it is decided, so a stream never shows part of a marker as content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|$)", re.S)

Delta = tuple[str, str]  # ("reasoning" | "content", text)


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: its id, the tool's name and the arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def input(self) -> dict[str, Any]:
        """The arguments as an object ({} when they are not a JSON object)."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def tool_call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of one call to one of `tools` (OpenAI function form):
    `{"name": <a tool's name>, "arguments": <its parameters>}`."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _held(text: str, marker: str) -> int:
    """How many trailing characters of `text` could be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _call(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(f"toolu_{uuid.uuid4().hex[:24]}", obj["name"], text)


class MessageParser:
    """Feed generated text (`feed`), get the deltas it completes; `finish` flushes the
    rest and returns the tool calls. `tools`: look for tool calls; `forced`: the whole
    answer is one call's JSON; `thinking`: the prompt already opened `<think>`."""

    def __init__(self, tools: bool = False, forced: bool = False, thinking: bool = False):
        self.tools = tools or forced
        self.forced = forced
        self.mode = "think" if thinking else "start"
        self.buf = ""  # text not yet decided
        self.tool_text = ""  # text from the first tool-call marker on (or all, forced)

    def feed(self, text: str) -> list[Delta]:
        """The deltas `text` completes, in order."""
        self.buf += text
        return self._drain(final=False)

    def finish(self) -> tuple[list[Delta], list[ToolCall]]:
        """The remaining deltas and the tool calls; a tool-call text that does not parse
        comes back as content."""
        out = self._drain(final=True)
        calls: list[ToolCall] = []
        if self.tool_text:
            calls = self._parse_calls(self.tool_text)
            if not calls and self.tool_text.strip():
                out.append(("content", self.tool_text))
        return out, calls

    def _parse_calls(self, text: str) -> list[ToolCall]:
        if self.forced:
            try:
                obj = json.loads(text)
            except ValueError:
                return []
            found = [_call(o) for o in (obj if isinstance(obj, list) else [obj])]
        else:
            found = []
            for m in _CALL.finditer(text):
                try:
                    found.append(_call(json.loads(m.group(1))))
                except ValueError:
                    found.append(None)
        return [c for c in found if c is not None] if all(found) else []

    def _drain(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while self.buf:
            if self.mode == "start":
                lead = self.buf.lstrip()
                if lead.startswith(THINK_OPEN):
                    self.buf, self.mode = lead[len(THINK_OPEN) :], "think"
                elif lead and not final and THINK_OPEN.startswith(lead) or not lead and not final:
                    break
                else:
                    self.mode = "content"
            elif self.mode == "after_think":  # the whitespace after </think>, in any chunks
                self.buf = self.buf.lstrip()
                if self.buf:
                    self.mode = "content"
            elif self.mode == "think":
                end = self.buf.find(THINK_CLOSE)
                if end >= 0:
                    out.append(("reasoning", self.buf[:end]))
                    self.buf, self.mode = self.buf[end + len(THINK_CLOSE) :], "after_think"
                    continue
                keep = 0 if final else _held(self.buf, THINK_CLOSE)
                out.append(("reasoning", self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
                break
            elif self.forced or self.mode == "tools":
                self.tool_text += self.buf
                self.buf = ""
            elif self.tools and (at := self.buf.find(CALL_OPEN)) >= 0:
                out.append(("content", self.buf[:at]))
                self.buf, self.mode = self.buf[at:], "tools"
            else:
                keep = 0 if final or not self.tools else _held(self.buf, CALL_OPEN)
                out.append(("content", self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
                break
        return [(kind, text) for kind, text in out if text]
