"""A model's answer split into `content`, `reasoning_content` and `tool_calls` by its
template's `ChatFormat`, whole or as a prefix of a stream.

`ChatParser.parse(text, partial)` parses the text generated so far. A partial parse only
reports what can no longer change: a marker's possible beginning, trailing whitespace and a
call's unfinished name are held back, so successive partial parses only ever extend each
other (`stream.MessageStream` turns them into OpenAI deltas), and the final parse extends the
last partial one. Tagged arguments (Qwen3-Coder's `<parameter=k>v</parameter>`, GLM's
`<arg_key>`) become a JSON object, each value typed by the tool's parameter schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from loraserve.chat.formats.calls import CallScan, scan_calls
from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.scan import held
from loraserve.chat.formats.special import parse_dialect

ReasoningFormat = Literal["none", "auto", "deepseek", "deepseek-legacy"]


@dataclass
class ToolCall:
    """One call: its id ("" until known), the function's name, the arguments as JSON text."""

    name: str
    arguments: str
    id: str = ""


@dataclass
class ParsedMessage:
    """An assistant message as parsed so far."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def _ws_start(text: str, i: int = 0) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i


class ChatParser:
    """Parses one request's answer. `tools`: the request's tools (OpenAI form) when calls are
    to be parsed (tool_choice not "none"); `reasoning_format`: "none" leaves reasoning in
    the content; `thinking_open`: the prompt already opened the reasoning block."""

    def __init__(
        self,
        fmt: ChatFormat,
        tools: list[dict[str, Any]] | None = None,
        reasoning_format: ReasoningFormat = "auto",
        thinking_open: bool = False,
        lead: str = "",
        response_format: bool = False,
    ) -> None:
        self.fmt = fmt
        self.lead = lead
        self.response_format = response_format
        self.tools = tools if tools and fmt.has_tools else None
        self.schemas = {
            t["function"]["name"]: t["function"].get("parameters") or {}
            for t in (self.tools or [])
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        }
        self.extract = reasoning_format != "none" and fmt.reasoning_mode != "none"
        self.thinking_open = thinking_open and self.extract
        self.r_start = fmt.reasoning_start.strip()
        self.r_end = fmt.reasoning_end.strip()
        self.trigger = fmt.trigger.strip()
        self.triggers = [self.trigger]
        if fmt.call_start_optional and fmt.name_prefix.strip():
            self.triggers.append(fmt.name_prefix.strip())
        self.triggers += [m.strip() for m in fmt.optional_markers]

    def parse(self, text: str, partial: bool) -> ParsedMessage:
        """The message in `text` (after `lead`, the turn's start the prompt already wrote);
        with `partial`, only what later text cannot change."""
        text = self.lead + text
        msg = ParsedMessage()
        if self.fmt.dialect:
            return self._dialect(text, partial, msg)
        pos = self._reasoning(text, partial, msg)
        if pos is None:
            return msg
        rest = text[pos:]
        if not self.tools:
            self._content(rest, partial, msg, tail=False)
            return msg
        at = self._find_trigger(rest, partial)
        if at is None:  # no call (yet)
            self._content(rest, partial, msg, tail=False)
            return msg
        if at < 0:  # undecided: the text so far may still become a call
            return msg
        scan = scan_calls(self.fmt, rest, at, partial, self.schemas)
        if not partial:  # an unfinished call (the answer ran out of tokens) is no call
            scan.calls = [c for c in scan.calls if _is_json(c.arguments)]
        if not partial and not scan.calls:
            self._content(rest, partial, msg, tail=False)
            return msg
        self._content(rest[:at], partial, msg, tail=True)
        if self.fmt.optional_markers:
            scan.end = _skip_markers(rest, scan.end, self.fmt.optional_markers)
        msg.tool_calls = [ToolCall(c.name, c.arguments, c.id) for c in scan.calls]
        after = rest[scan.end :].strip() if not partial else ""
        f = self.fmt  # what may follow the calls: closers, or an unfinished next call
        closers = [m.strip() for m in (f.call_end, f.section_end, self.trigger, f.call_start)]
        closers += [","] if f.array_wrapped else []
        if after and not any(m and (after.startswith(m) or m.startswith(after)) for m in closers):
            msg.content += rest[scan.end :]  # text after the calls (an unfinished call: dropped)
        return msg

    def _dialect(self, text: str, partial: bool, msg: ParsedMessage) -> ParsedMessage:
        schemas = self.schemas if self.tools is not None else None
        content, reasoning, calls = parse_dialect(
            self.fmt.dialect, text, partial, schemas, self.extract
        )
        msg.content, msg.reasoning_content = content, reasoning
        msg.tool_calls = [ToolCall(n, a, i) for n, a, i in calls]
        if not partial:
            msg.tool_calls = [c for c in msg.tool_calls if _is_json(c.arguments)]
        return msg

    def _reasoning(self, text: str, partial: bool, msg: ParsedMessage) -> int | None:
        """Fill reasoning_content; the position content starts at, or None when nothing
        after the reasoning is known yet."""
        if not self.extract:
            return 0
        start = 0
        if not self.thinking_open:
            lead = _ws_start(text)
            if self.r_end and text.startswith(self.r_end, lead):  # an empty, closed block
                return _ws_start(text, lead + len(self.r_end))
            if partial and self.r_end and self.r_end.startswith(text[lead:]):
                return None
            if not self.r_start:
                return 0
            if text.startswith(self.r_start, lead):
                start = lead + len(self.r_start)
            elif partial and self.r_start.startswith(text[lead:]):
                return None
            else:
                return 0
        ends = [self.r_end] if self.r_end else []
        ends += [m.strip() for m in self.fmt.reasoning_stops]
        found = [(text.find(e, start), e) for e in ends]
        found = [(i, e) for i, e in found if i >= 0]
        if not found:
            body = text[start:]
            if partial:
                body = body[: len(body) - held(body, ends)].rstrip()
            msg.reasoning_content = body.strip() if not partial else body.lstrip()
            return None if partial else len(text)
        i, e = min(found)
        msg.reasoning_content = text[start:i].strip()
        after = i + len(e) if e == self.r_end else i  # a call's start stays for the calls
        return _ws_start(text, after)

    def _find_trigger(self, rest: str, partial: bool) -> int | None:
        """Where the calls start in `rest`: an index, None (no call, all content), or -1
        (a partial text that may still turn out to be a call)."""
        if self.trigger:
            found = [rest.find(t) for t in self.triggers]
            found = [i for i in found if i >= 0]
            if found:
                return min(found)
            return None
        lead = _ws_start(rest)
        opener = "[" if self.fmt.array_wrapped else "{"
        if lead == len(rest):
            return -1 if partial else None
        return lead if rest[lead] in (opener, "{") else None

    def _content(self, text: str, partial: bool, msg: ParsedMessage, tail: bool) -> None:
        fmt = self.fmt
        if fmt.content_start and fmt.content_end:
            s = text.find(fmt.content_start.strip())
            before = text[:s] if s >= 0 and not self.extract and not tail else ""
            if s >= 0:  # unextracted reasoning before the wrapped content stays content
                text = text[s + len(fmt.content_start.strip()) :].lstrip()
                e = text.find(fmt.content_end.strip())
                if e >= 0:
                    text = text[:e]
                text = before + text
            elif partial and not tail and self.extract:  # no content before its marker
                text = ""
        if partial and not tail:
            markers = list(self.triggers) if self.tools and self.trigger else []
            markers += [m.strip() for m in (fmt.content_start, fmt.content_end) if m.strip()]
            if self.extract and self.r_start and not msg.reasoning_content and not text.strip():
                markers.append(self.r_start)
            text = text[: len(text) - held(text, markers)].rstrip()
        elif tail or partial:
            text = text.rstrip()
        msg.content = _unfence(text, partial) if self.response_format else text


FENCE_OPEN, FENCE_CLOSE = "```json", "```"


def _unfence(text: str, partial: bool) -> str:
    """A response-format answer without the ```json fence a model may wrap it in, and
    without surrounding whitespace, as llama.cpp's response-format parser reads it; a
    partial text holds back what may still become a fence."""
    body = text.strip() if not partial else text.lstrip()
    if body.startswith(FENCE_OPEN):
        body = body[len(FENCE_OPEN) :].lstrip()
        body = body.rstrip().removesuffix(FENCE_CLOSE)
        return body[: len(body) - held(body, (FENCE_CLOSE,))].rstrip() if partial else body.rstrip()
    if partial and FENCE_OPEN.startswith(body):
        return ""
    return body


def _skip_markers(text: str, i: int, markers: tuple[str, ...]) -> int:
    j = _ws_start(text, i)
    for m in markers:
        if text.startswith(m.strip(), j):
            return _skip_markers(text, j + len(m.strip()), markers)
    return i


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object ({} when they are not a JSON object)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


__all__ = ["CallScan", "ChatParser", "ParsedMessage", "ReasoningFormat", "ToolCall"]
