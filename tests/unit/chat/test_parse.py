"""The assistant-output parser (`chat/parse.py`): reasoning, content and tool calls
split the same way whatever the chunks the text streams in (hypothesis over split points),
and never a piece of a marker shown as content; and the forced-call schema."""

from __future__ import annotations

import json

import jsonschema
from hypothesis import given
from hypothesis import strategies as st

from loraserve.chat.parse import MessageParser, tool_call_schema


def parse(chunks: list[str], **kw) -> tuple[str, str, list[tuple[str, dict]]]:
    p = MessageParser(**kw)
    deltas = [d for c in chunks for d in p.feed(c)]
    rest, calls = p.finish()
    deltas += rest
    reasoning = "".join(t for k, t in deltas if k == "reasoning")
    content = "".join(t for k, t in deltas if k == "content")
    return reasoning, content, [(c.name, c.input()) for c in calls]


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


CASES = [
    ("<think>plan it</think>\n\nHello <b>", {}, ("plan it", "Hello <b>", [])),
    ("  <think>a</think>b", {}, ("a", "b", [])),
    ("no <think> here", {}, ("", "no <think> here", [])),
    ("still thinking</think>done", {"thinking": True}, ("still thinking", "done", [])),
    ("<think>cut off", {}, ("cut off", "", [])),
    (
        'Sure <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
        {"tools": True},
        ("", "Sure ", [("f", {"a": 1})]),
    ),
    (
        '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g"}',
        {"tools": True},
        ("", "", [("f", {}), ("g", {})]),
    ),
    ("a <tool_call>{broken", {"tools": True}, ("", "a <tool_call>{broken", [])),
    ('<tool_call>{"name": "f"}</tool_call>', {}, ("", '<tool_call>{"name": "f"}</tool_call>', [])),
    ("a < b <tool", {"tools": True}, ("", "a < b <tool", [])),
    ('{"name": "f", "arguments": {"x": "y"}}', {"forced": True}, ("", "", [("f", {"x": "y"})])),
    ('{"name": "f", "argu', {"forced": True}, ("", '{"name": "f", "argu', [])),
]


@given(st.sampled_from(CASES), st.lists(st.integers(0, 80), max_size=8))
def test_any_chunking_parses_the_same(case, cuts) -> None:
    text, kw, want = case
    assert parse([text], **kw) == want
    assert parse(split(text, cuts), **kw) == want


@given(st.lists(st.integers(0, 60), max_size=6))
def test_a_marker_is_never_streamed_as_content(cuts) -> None:
    text = 'ok <tool_call>{"name": "f", "arguments": {}}</tool_call>'
    p = MessageParser(tools=True)
    streamed = "".join(t for c in split(text, cuts) for _, t in p.feed(c))
    assert streamed == "ok "


def test_forced_schema_accepts_exactly_one_call_of_a_listed_tool() -> None:
    params = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tools = [
        {"type": "function", "function": {"name": n, "parameters": params}} for n in ("f", "g")
    ]
    schema = tool_call_schema(tools)
    jsonschema.validate({"name": "g", "arguments": {"a": 1}}, schema)
    bads = ({"name": "h", "arguments": {"a": 1}}, {"name": "f"}, {"name": "f", "arguments": {}})
    for bad in bads:
        try:
            jsonschema.validate(bad, schema)
        except jsonschema.ValidationError:
            continue
        raise AssertionError(f"accepted {json.dumps(bad)}")
    assert tool_call_schema(tools[:1])["properties"]["name"] == {"const": "f"}
