"""Random tools and calls, and the checks every round trip of a call through a template runs
(the stream's deltas adding up to its final message; which markers are named tokens), over the
sdist's templates as the server renders them."""

from __future__ import annotations

from hypothesis import strategies as st

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.parse import ChatParser
from loraserve.chat.formats.stream import MessageStream
from loraserve.chat.render import RenderInputs, Tokens, render
from tests.unit.chat.format_util import TEMPLATES
from tests.unit.chat.oracle_util import template_format

NAMES = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)
TEXT = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters=" .,-"),
               min_size=1, max_size=12).map(str.strip).filter(bool)  # fmt: skip
VALUE = {"string": TEXT, "integer": st.integers(-1000, 1000), "boolean": st.booleans()}


@st.composite
def tool_and_call(draw: st.DrawFn) -> tuple[dict, dict]:
    """A tool with 1-3 typed parameters and a call of it with every parameter set."""
    keys = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    types = [draw(st.sampled_from(sorted(VALUE))) for _ in keys]
    name = draw(NAMES)
    params = {
        "type": "object",
        "properties": {k: {"type": t} for k, t in zip(keys, types, strict=True)},
        "required": keys,
    }
    args = {k: draw(VALUE[t]) for k, t in zip(keys, types, strict=True)}
    tool = {
        "type": "function",
        "function": {"name": name, "description": "x", "parameters": params},
    }
    return tool, args


def check_stream(parser: ChatParser, text: str) -> dict:
    """Feed text to a stream one character at a time: its deltas must add up to its final
    message (content, reasoning, each call's head once and its arguments); the calls by index."""
    stream = MessageStream(parser)
    deltas = []
    for i in range(len(text)):
        deltas += stream.feed(text[i])
    deltas += stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            got = calls.setdefault(c["index"], {"name": "", "arguments": "", "id": None})
            if "id" in c:
                assert got["id"] is None, "a call's head is sent once"
                got["id"], got["name"] = c["id"], c["function"]["name"]
            got["arguments"] += c["function"].get("arguments", "")
    final = stream.final
    assert content == final.content and reasoning == final.reasoning_content
    assert [(c["name"], c["arguments"], c["id"]) for c in calls.values()] == [
        (c.name, c.arguments, c.id) for c in final.tool_calls
    ]
    return calls


def named_token(fmt: ChatFormat):  # noqa: ANN202 - Callable[[str], bool]
    """Whether a marker is one of the dialect's tokens llguidance can name (`<..>`): those
    are single special tokens in the test vocabulary. Field-described formats keep every
    marker as text, as their grammar tests always have."""
    if not fmt.dialect:
        return lambda m: False
    return lambda m: m in fmt.preserved_tokens and m[0] == "<" and m[-1] == ">"


TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["city", "n"]}}}  # fmt: skip


NO_WRITTEN_CALL = {"LFM2-8B-A1B.jinja", "LFM2.5-Instruct.jinja"}
STOPS = ("<|call|>",)  # gpt-oss ends a call's message with a stop token the output never holds


def with_tools(name: str) -> bool:
    """Whether llama.cpp's rules find a tool-call format in the template."""
    return template_format(name).has_tools


ALL = [p.name for p in sorted(TEMPLATES.glob("*.jinja"))]
WITH_TOOLS = [n for n in ALL if n not in NO_WRITTEN_CALL and with_tools(n)]


def server_render(source: str):  # noqa: ANN202 - format_util's renderer signature
    """A template's renderer as the server renders (llama.cpp's rules), for `detect`."""

    def run(msgs: list, tools: list | None, gen: bool, think: bool) -> str:
        inp = RenderInputs(msgs, tools=tools, add_generation_prompt=gen, enable_thinking=think)
        return render(source, Tokens("<s>", "</s>"), inp)

    return run
