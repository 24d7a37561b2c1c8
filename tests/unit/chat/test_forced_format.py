"""The notation of a forced call (`tool_choice` required / a named function) on the templates
whose format llama-server finds without tool calls (`formats.forced`).

llama.cpp's recorded analysis (tests/data/chat/render_cases.json) gives these six templates
no tool format, so llama-server parses plain content and constrains nothing. Ours forces the
call in the template's own notation where it has one: DeepSeek R1 Distill Llama 8B writes
R1 Distill Qwen 32B's calls (for a message with null content and string arguments), so its
forced format is the description llama.cpp finds for Qwen 32B, and it parses llama.cpp's
own Qwen 32B call case as llama.cpp does; Granite 3.3's instructions describe
`<|tool_call|>` followed by a JSON list. The four that neither render nor describe a call
(SmolLM3, Gemma 2, Phi 3.5, RWKV World) get none: bare JSON is forced there.
"""

from __future__ import annotations

import json
from functools import cache

import pytest

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.forced import template_forced_format
from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.parse import ChatParser
from loraserve.chat.render import RenderInputs, Tokens, direct_apply
from tests.unit.chat.format_util import DATA, TEMPLATES, grammar_accepts
from tests.unit.chat.oracle_util import template_format

LLAMA_8B = "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"
QWEN_32B = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
GRANITE = "ibm-granite-granite-3.3-2B-Instruct.jinja"
NO_CALL_FORM = (
    "HuggingFaceTB-SmolLM3-3B.jinja", "google-gemma-2-2b-it.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja", "llama-cpp-rwkv-world.jinja",
)  # fmt: skip
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


@cache
def _render_data() -> dict:
    return json.loads((DATA / "render_cases.json").read_text())


def _forced(name: str) -> ChatFormat | None:
    src = (TEMPLATES / name).read_text()
    return template_forced_format(template_format(name), src, Tokens("<s>", "</s>"))


@pytest.mark.parametrize("name", [*NO_CALL_FORM, LLAMA_8B, GRANITE])
def test_llama_cpp_finds_no_tool_format_for_these(name: str) -> None:
    analysis = _render_data()["templates"][name]["analysis"]
    assert analysis["tools"]["format"]["mode"] == "NONE"
    assert not template_format(name).has_tools


@pytest.mark.parametrize("name", NO_CALL_FORM)
def test_templates_showing_no_call_get_bare_json(name: str) -> None:
    assert _forced(name) is None


def test_r1_distill_llama_forces_the_calls_llama_cpp_reads_for_qwen() -> None:
    fmt = _forced(LLAMA_8B)
    assert fmt is not None and fmt.tool_mode == "tag_json"
    want = _render_data()["templates"][QWEN_32B]["analysis"]["tools"]
    got = (fmt.section_start, fmt.section_end, fmt.call_start, fmt.call_end, fmt.name_prefix,
           fmt.name_suffix, fmt.call_close)  # fmt: skip
    f, fn = want["format"], want["function"]
    assert got == (f["section_start"], f["section_end"], f["per_call_start"], f["per_call_end"],
                   fn["name_prefix"], fn["name_suffix"], fn["close"])  # fmt: skip
    cases = json.loads((DATA / "parse_cases.json").read_text())["cases"]
    calls = [c for c in cases if c["template"] == QWEN_32B and c["parsed"]["tool_calls"]]
    assert calls
    for case in calls:
        tools = case["request"]["tools"]
        msg = ChatParser(fmt, tools, "deepseek").parse(case["input"], partial=False)
        got_calls = [(c.name, json.loads(c.arguments)) for c in msg.tool_calls]
        want_calls = [(c["name"], json.loads(c["arguments"])) for c in case["parsed"]["tool_calls"]]
        assert got_calls == want_calls
        lark = tool_grammar(fmt, tools, "required")  # the markers spelled as text
        assert lark is not None and grammar_accepts(lark, case["input"]) is None


def test_r1_distill_llama_parses_the_calls_its_template_writes() -> None:
    fmt = _forced(LLAMA_8B)
    assert fmt is not None
    src = (TEMPLATES / LLAMA_8B).read_text()
    args = '{"city": "Paris", "days": 2}'
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
    user = [{"role": "user", "content": "Weather?"}]
    tokens = Tokens("<s>", "</s>")
    prompt = direct_apply(src, tokens, user, [TOOL], RenderInputs(user), True)
    msgs = [*user, {"role": "assistant", "content": None, "tool_calls": [call]}]
    whole = direct_apply(src, tokens, msgs, [TOOL], RenderInputs(msgs), False)
    assert prompt.endswith("<｜Assistant｜><think>\n")  # the model reasons, then calls
    turn = whole[len(prompt) - len("<think>\n") :]  # '<｜tool▁calls▁begin｜>..' (never closed)
    answer = "Paris, then.</think>" + turn
    msg = ChatParser(fmt, [TOOL], "deepseek", thinking_open=True).parse(answer, partial=False)
    (got,) = msg.tool_calls
    assert msg.reasoning_content == "Paris, then."
    assert (got.name, json.loads(got.arguments)) == ("get_weather", {"city": "Paris", "days": 2})
    lark = tool_grammar(fmt, [TOOL], "required", thinking_open=True)
    assert lark is not None and grammar_accepts(lark, answer + "<｜tool▁calls▁end｜>") is None


def test_granite_forces_its_described_tool_call_list() -> None:
    fmt = _forced(GRANITE)
    assert fmt is not None and fmt.section_start == "<|tool_call|>" and fmt.array_wrapped
    text = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]'
    (got,) = ChatParser(fmt, [TOOL], "deepseek").parse(text, partial=False).tool_calls
    assert (got.name, json.loads(got.arguments)) == ("get_weather", {"city": "Paris", "days": 2})
    specials = ("<|tool_call|>",)
    lark = tool_grammar(fmt, [TOOL], "required", special=lambda m: m in specials)
    assert lark is not None and grammar_accepts(lark, text, specials) is None
    bad = text.replace("2}", '"two"}')  # days must be an integer
    assert grammar_accepts(lark, bad, specials) is not None
