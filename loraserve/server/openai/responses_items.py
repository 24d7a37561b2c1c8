"""The Responses API's tools and output items: its flat function tools
(`{"type": "function", "name", "parameters"}`) and `tool_choice` as chat completions'
forms, and a parsed answer (`chat.formats`) as output items: `reasoning`, `message`,
`function_call` (whole, and as the stream's named events: `response.output_item.added`,
`response.reasoning_text.delta`, `response.output_text.delta`,
`response.function_call_arguments.delta`, then the `.done` events)."""

from __future__ import annotations

import uuid
from typing import Any

from loraserve.chat.formats.parse import ParsedMessage
from loraserve.server.errors import invalid_request

Body = dict[str, Any]


def chat_tools(body: Body) -> tuple[list[Body] | None, Any]:
    """`tools` and `tool_choice` in chat completions' form (a 400 naming a bad tool)."""
    tools = body.get("tools")
    if tools is None:
        return None, body.get("tool_choice")
    if not isinstance(tools, list):
        raise invalid_request("tools: must be a list of tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise invalid_request(f"tools[{i}]: only function tools are supported")
        if "function" in t:  # already the chat form
            out.append(t)
            continue
        fn = {k: t[k] for k in ("name", "description", "parameters") if k in t}
        out.append({"type": "function", "function": fn})
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return out, choice


def text_part(text: str) -> Body:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def message_item(mid: str, text: str) -> Body:
    return {
        "type": "message",
        "status": "completed",
        "id": mid,
        "content": [text_part(text)],
        "role": "assistant",
    }


def reasoning_item(rid: str, text: str) -> Body:
    return {
        "type": "reasoning",
        "id": rid,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def call_item(fid: str, call_id: str, name: str, arguments: str, status: str) -> Body:
    return {
        "type": "function_call",
        "id": fid,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_items(msg: ParsedMessage, mid: str) -> list[Body]:
    """The output items of a whole answer: reasoning, the message, then the calls."""
    out: list[Body] = []
    if msg.reasoning_content:
        out.append(reasoning_item(f"rs_{uuid.uuid4().hex}", msg.reasoning_content))
    if msg.content:
        out.append(message_item(mid, msg.content))
    out += [
        call_item(f"fc_{uuid.uuid4().hex}", c.id, c.name, c.arguments, "completed")
        for c in msg.tool_calls
    ]
    return out


class ItemEvents:
    """The named stream events of one answer's deltas (OpenAI chat deltas from
    `chat.formats.stream.MessageStream`), each item opened when its first delta comes and
    all closed at the end (`finish`), in output order."""

    def __init__(self, mid: str) -> None:
        self.mid = mid
        self.items: list[Body] = []  # the open / finished items, in order
        self.kind = ""  # the kind of the last item: reasoning / message / call index
        self.calls: dict[int, Body] = {}

    def delta(self, d: Body) -> list[Body]:
        """The events of one delta."""
        if "reasoning_content" in d:
            return self._text("reasoning", d["reasoning_content"])
        if "content" in d:
            return self._text("message", d["content"])
        events: list[Body] = []
        for c in d.get("tool_calls", []):
            if "id" in c:
                item = call_item(f"fc_{uuid.uuid4().hex}", c["id"], c["function"]["name"], "",
                                 "in_progress")  # fmt: skip
                self.calls[c["index"]] = item
                self.items.append(item)
                self.kind = f"call{c['index']}"
                events.append({"type": "response.output_item.added", "item": dict(item)})
            item = self.calls[c["index"]]
            fragment = c["function"].get("arguments", "")
            if fragment:
                item["arguments"] += fragment
                events.append({"type": "response.function_call_arguments.delta",
                               "item_id": item["id"], "delta": fragment})  # fmt: skip
        return events

    def _text(self, kind: str, text: str) -> list[Body]:
        events: list[Body] = []
        if self.kind != kind:
            self.kind = kind
            iid = self.mid if kind == "message" else f"rs_{uuid.uuid4().hex}"
            item = {"type": kind, "id": iid, "status": "in_progress", "text": ""}
            if kind == "message":
                item |= {"role": "assistant", "content": []}
            self.items.append(item)
            shown = {k: v for k, v in item.items() if k != "text"}
            events.append({"type": "response.output_item.added", "item": shown})
            if kind == "message":
                part = {"type": "output_text", "text": ""}
                events.append({"type": "response.content_part.added", "item_id": iid,
                               "part": part})  # fmt: skip
        item = self.items[-1]
        item["text"] += text
        name = (
            "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        )
        return [*events, {"type": name, "item_id": item["id"], "delta": text}]

    def finish(self) -> tuple[list[Body], list[Body]]:
        """The closing events and the finished output items."""
        events: list[Body] = []
        output: list[Body] = []
        for item in self.items:
            if item["type"] == "function_call":
                done = {**item, "status": "completed"}
                events.append({"type": "response.function_call_arguments.done",
                               "item_id": item["id"], "arguments": item["arguments"]})  # fmt: skip
            elif item["type"] == "message":
                done = message_item(item["id"], item["text"])
                events.append({"type": "response.output_text.done", "item_id": item["id"],
                               "text": item["text"]})  # fmt: skip
                events.append({"type": "response.content_part.done", "item_id": item["id"],
                               "part": text_part(item["text"])})  # fmt: skip
            else:
                done = reasoning_item(item["id"], item["text"])
                events.append({"type": "response.reasoning_text.done", "item_id": item["id"],
                               "text": item["text"]})  # fmt: skip
            events.append({"type": "response.output_item.done", "item": done})
            output.append(done)
        return events, output
