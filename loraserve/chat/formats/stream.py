"""An answer's text, fed as it is generated, turned into OpenAI chat-completion deltas.

Each `feed` re-parses the whole text so far as partial (`ChatParser.parse`, as llama.cpp
re-parses its output each step) and sends the difference from the last parse:
`reasoning_content` and `content` text, and for tool calls first `{index, id, type, name}`
and then argument fragments. `finish` parses the text as complete and sends the rest; the
deltas add up to the final message (a call cut off by the token limit, which the complete
parse drops, stays in it with the arguments sent so far). A call the model gives no id gets
fixed at its first delta. Continuing a prefilled assistant message, the deltas start
from the prefill's own parse (llama-server's `is_continuation` without `echo`), while the
whole message includes it.
"""

from __future__ import annotations

import uuid
from typing import Any

from loraserve.chat.formats.parse import ChatParser, ParsedMessage, ToolCall


def new_call_id(prefix: str = "call_") -> str:
    """A fresh call id (OpenAI's form; Anthropic's with prefix "toolu_")."""
    return prefix + uuid.uuid4().hex[:24]


class MessageStream:
    """The deltas of one answer (`feed` the generated text, then `finish`)."""

    def __init__(
        self, parser: ChatParser, id_prefix: str = "call_", continuation: bool = False
    ) -> None:
        self.parser = parser
        self.id_prefix = id_prefix
        self.text = ""
        self.sent = ParsedMessage()
        if continuation:  # llama-server: a prefilled message is not sent again as deltas
            self.sent = parser.parse("", partial=True)
            self.sent.tool_calls = []
            whole = parser.parse("", partial=False).content  # the prefill's own trailing space
            if whole.startswith(self.sent.content) and not whole[len(self.sent.content) :].strip():
                self.sent.content = whole
        self.ids: list[str] = []
        self.final: ParsedMessage | None = None

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """The deltas the new text completes (each an OpenAI `delta` object)."""
        self.text += piece
        return self._advance(self.parser.parse(self.text, partial=True))

    def finish(self) -> list[dict[str, Any]]:
        """The remaining deltas; `self.final` is then the whole message (ids filled in)."""
        msg = self.parser.parse(self.text, partial=False)
        out = self._advance(msg)
        # a call the deltas opened stays in the message when the complete parse drops it (an
        # answer cut inside a call, as OpenAI's: its arguments so far): deltas add up to it
        for sent in self.sent.tool_calls[len(msg.tool_calls) :]:
            msg.tool_calls.append(ToolCall(sent.name, sent.arguments, sent.id))
        for i, call in enumerate(msg.tool_calls):
            call.id = self.ids[i] if i < len(self.ids) else call.id or new_call_id(self.id_prefix)
        self.final = msg
        return out

    def _advance(self, msg: ParsedMessage) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        sent = self.sent
        if len(msg.reasoning_content) > len(sent.reasoning_content):
            if msg.reasoning_content.startswith(sent.reasoning_content):
                out.append(
                    {"reasoning_content": msg.reasoning_content[len(sent.reasoning_content) :]}
                )
        if len(msg.content) > len(sent.content) and msg.content.startswith(sent.content):
            out.append({"content": msg.content[len(sent.content) :]})
        for i, call in enumerate(msg.tool_calls):
            if i >= len(sent.tool_calls):
                self.ids.append(call.id or new_call_id(self.id_prefix))
                sent.tool_calls.append(ToolCall(call.name, "", self.ids[i]))
                out.append(_call_delta(i, self.ids[i], call.name, call.arguments))
                sent.tool_calls[i].arguments = call.arguments
                continue
            old = sent.tool_calls[i].arguments
            if len(call.arguments) > len(old) and call.arguments.startswith(old):
                out.append(_args_delta(i, call.arguments[len(old) :]))
                sent.tool_calls[i].arguments = call.arguments
        if msg.reasoning_content.startswith(sent.reasoning_content):
            sent.reasoning_content = msg.reasoning_content
        if msg.content.startswith(sent.content):
            sent.content = msg.content
        return out


def _call_delta(index: int, id_: str, name: str, arguments: str) -> dict[str, Any]:
    fn = {"name": name, "arguments": arguments}
    return {"tool_calls": [{"index": index, "id": id_, "type": "function", "function": fn}]}


def _args_delta(index: int, fragment: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}


def message_dict(msg: ParsedMessage) -> dict[str, Any]:
    """The OpenAI `message` of a parsed answer (content None when there are only calls)."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    if msg.tool_calls:
        out["content"] = msg.content or None
        out["tool_calls"] = [
            {
                "id": c.id or new_call_id(),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in msg.tool_calls
        ]
    return out
