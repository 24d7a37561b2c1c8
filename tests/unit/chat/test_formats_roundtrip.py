"""Per format, random tool schemas and calls: the call as the template itself writes it in
an assistant turn parses back to the same call, whole and streamed (every prefix parsed as
partial, the deltas only ever extending, adding up to the whole), and the grammar forced by
`tool_choice: required` accepts that text."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.detect import detect
from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.lead import opens_reasoning
from loraserve.chat.formats.parse import ChatParser, arguments_object
from loraserve.chat.formats.special.grammars import dialect_grammar
from tests.unit.chat.format_util import TEMPLATES, assistant_text, grammar_accepts, render_for
from tests.unit.chat.oracle_util import CASES
from tests.unit.chat.roundtrip_util import TOOL, check_stream, named_token, tool_and_call

# P0 and P1 templates whose calls the formats describe, and the specialised formats whose
# templates write a call in the assistant turn (LFM2's put calls in the content; gpt-oss's
# turn ends in <|call|>, a stop token the model's output never holds)
FORMATS = [
    "Qwen-Qwen3-0.6B.jinja", "Qwen-QwQ-32B.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja", "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "Qwen3-Coder.jinja", "Qwen3.5-4B.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "MiniMax-M2.jinja", "deepseek-ai-DeepSeek-V3.1.jinja",
    "moonshotai-Kimi-K2.jinja", "google-gemma-4-31B-it.jinja",
    "google-gemma-4-31B-it-interleaved.jinja", "deepseek-ai-DeepSeek-V3.2.jinja",
    "deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja",
    "MiniMax-M3.jinja", "Kimi-K3.jinja", "inclusionai-ling-3.0-flash.jinja", "Cohere2MoE.jinja",
    "GigaChat3-10B-A1.8B.jinja", "muse-glimmer.jinja",
]  # fmt: skip


@pytest.mark.parametrize("name", FORMATS)
def test_template_written_call_parses_back(name: str) -> None:
    src = (TEMPLATES / name).read_text()
    logging.disable(logging.WARNING)
    fmt = detect(src, render_for(src))
    logging.disable(logging.NOTSET)
    assert fmt.has_tools, fmt

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(tool_and_call())
    def check(case: tuple[dict, dict]) -> None:
        tool, args = case
        fn = tool["function"]["name"]
        call = {"id": "abc123def", "type": "function", "function": {"name": fn, "arguments": args}}
        msg = {"role": "assistant", "content": "", "tool_calls": [call]}
        text = assistant_text(src, msg, [tool])
        parser = ChatParser(fmt, [tool])
        whole = parser.parse(text, partial=False)
        assert [c.name for c in whole.tool_calls] == [fn], (text, whole)
        assert arguments_object(whole.tool_calls[0].arguments) == args, (text, whole)
        assert not whole.content.strip() or not whole.content.strip().startswith(fmt.trigger)
        streamed = check_stream(parser, text)
        assert json.loads(streamed[0]["arguments"]) == args
        named = named_token(fmt)
        lark = tool_grammar(fmt, [tool], "required", thinking_open=False, special=named)
        lark = lark or dialect_grammar(fmt, [tool], "required", special=named)
        python_bools = fmt.tool_mode == "tag_tagged" and any(
            isinstance(v, bool) for v in args.values()
        )
        if lark is not None and not whole.reasoning_content and not python_bools:
            start = text if fmt.dialect else text.lstrip()  # Muse's answer starts " to="
            body = text[text.find(fmt.trigger.strip()) :] if fmt.trigger else start
            specials = tuple(t for t in fmt.preserved_tokens if named(t))
            assert grammar_accepts(lark, body, specials) is None, (text, lark)

    check()


# dialects whose `required` grammar is built (special/grammars.py)
DIALECT_GRAMMARS = (
    "google-gemma-4-31B-it.jinja", "deepseek-ai-DeepSeek-V3.2.jinja",
    "deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja",
    "inclusionai-ling-3.0-flash.jinja", "Kimi-K3.jinja", "Cohere2MoE.jinja", "MiniMax-M3.jinja",
    "LFM2-8B-A1B.jinja", "LFM2.5-8B-A1B.jinja", "LFM2.5-Instruct.jinja", "muse-glimmer.jinja",
    "meetkai-functionary-medium-v3.2.jinja",
)  # fmt: skip


def _dialect_format(name: str) -> ChatFormat:
    src = (TEMPLATES / name).read_text()
    return detect(src, render_for(src))


def test_dialect_grammar_accepts_llama_cpps_calls() -> None:
    """Every whole call of llama.cpp's parse cases for these dialects, from its trigger on,
    is accepted by the grammar `required` builds for the case's tools (but for a value that
    holds one of the format's special tokens: grammar text never holds one; and text before
    the call where no trigger word marks the call's start: `required` allows none)."""
    checked = 0
    for case in CASES:
        req = case["request"]
        if case["template"] not in DIALECT_GRAMMARS or case["is_partial"] or not req["tools"]:
            continue
        fmt = _dialect_format(case["template"])
        values = "".join(c["arguments"] for c in case["expect"]["tool_calls"])
        if not values or any(t in values for t in fmt.preserved_tokens):
            continue
        if not fmt.trigger and case["expect"]["content"].strip():
            continue
        named = named_token(fmt)
        lark = dialect_grammar(fmt, req["tools"], "required", special=named)
        text, end = case["input"], fmt.reasoning_end.strip()
        after = text.find(end) if end and end in text else 0  # a trigger inside reasoning
        body = text[text.find(fmt.trigger, after) :]
        specials = tuple(t for t in fmt.preserved_tokens if named(t))
        assert grammar_accepts(lark, body, specials) is None, (case["id"], body)
        checked += 1
    assert checked >= 100


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("google-gemma-4-31B-it.jinja", '<|tool_call>call:get_time{city:<|"|>Oslo<|"|>,n:3}'
         "<tool_call|>", '<|tool_call>call:get_time{city:<|"|>Oslo<|"|>,n:<|"|>3<|"|>}'),
        ("deepseek-ai-DeepSeek-V3.2.jinja", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="'
         'get_time">\n<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
         '<｜DSML｜parameter name="n" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
         "</｜DSML｜function_calls>", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_time">'
         '\n<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n<｜DSML｜'
         'parameter name="n" string="false">"3"'),
    ],
)  # fmt: skip
def test_dialect_grammar_enforces_the_schema(name: str, good: str, bad: str) -> None:
    """The call as the schema allows it is accepted; a string for an integer, or another
    function's name, is not."""
    fmt = _dialect_format(name)
    named = named_token(fmt)
    specials = tuple(t for t in fmt.preserved_tokens if named(t))
    lark = dialect_grammar(fmt, [TOOL], "required", special=named)
    assert grammar_accepts(lark, good, specials) is None
    assert grammar_accepts(lark, bad, specials) is not None
    other = good.replace("get_time", "get_date")
    assert grammar_accepts(lark, other, specials) is not None


LAZY = ("google-gemma-4-31B-it.jinja", "deepseek-ai-DeepSeek-V3.2.jinja",
        "deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja",
        "inclusionai-ling-3.0-flash.jinja", "Kimi-K3.jinja", "Cohere2MoE.jinja",
        "MiniMax-M3.jinja", "LFM2-8B-A1B.jinja", "LFM2.5-8B-A1B.jinja",
        "LFM2.5-Instruct.jinja", "muse-glimmer.jinja",
        "meetkai-functionary-medium-v3.2.jinja")  # fmt: skip


@pytest.mark.parametrize("tokens", [True, False])
def test_dialect_auto_grammar_accepts_llama_cpps_answers(tokens: bool) -> None:
    """Under `auto` (every dialect: a word triggers, or Muse's and Functionary's patterns)
    every whole answer of llama.cpp's cases with tools, reasoning and text included, is
    accepted: the markers as special tokens, or all as text (a vocabulary without them).
    Skipped: answers whose reasoning or values hold one of the format's special tokens
    (grammar text never holds one)."""
    checked = 0
    for case in CASES:
        req = case["request"]
        if case["template"] not in LAZY or case["is_partial"] or not req["tools"]:
            continue
        fmt = _dialect_format(case["template"])
        named = named_token(fmt) if tokens else (lambda m: False)
        exp = case["expect"]
        inner = exp["reasoning_content"] + "".join(c["arguments"] for c in exp["tool_calls"])
        if any(t in inner for t in fmt.preserved_tokens):
            continue
        opened = opens_reasoning(fmt, case["params"]["generation_prompt"].rstrip())
        lark = dialect_grammar(fmt, req["tools"], "auto", True, opened, named)
        specials = tuple(t for t in fmt.preserved_tokens if named(t))
        assert grammar_accepts(lark, case["input"], specials) is None, case["id"]
        checked += 1
    assert checked >= 100


def test_dialect_auto_grammar_constrains_only_the_calls() -> None:
    """Free text passes; after the trigger, the call must fit the schema."""
    fmt = _dialect_format("google-gemma-4-31B-it.jinja")
    named = named_token(fmt)
    specials = tuple(t for t in fmt.preserved_tokens if named(t))
    lark = dialect_grammar(fmt, [TOOL], "auto", special=named)
    call = '<|tool_call>call:get_time{city:<|"|>Oslo<|"|>,n:3}<tool_call|>'
    assert grammar_accepts(lark, "Any text { at all: 3 }", specials) is None
    assert grammar_accepts(lark, "Let me see." + call + " Done.", specials) is None
    assert grammar_accepts(lark, call.replace("n:3", "n:x"), specials) is not None


def test_gemma_grammar_binds_each_key_once() -> None:
    """Gemma 4's arguments: keys in the sorted order its template writes, each once, the
    required ones present (a tiny model otherwise repeats a key for ever)."""
    fmt = _dialect_format("google-gemma-4-31B-it.jinja")
    named = named_token(fmt)
    specials = tuple(t for t in fmt.preserved_tokens if named(t))
    lark = dialect_grammar(fmt, [TOOL], "required", special=named)
    call = "<|tool_call>call:get_time{{{}}}<tool_call|>".format
    assert grammar_accepts(lark, call('city:<|"|>Oslo<|"|>,n:3'), specials) is None
    assert grammar_accepts(lark, call('city:<|"|>Oslo<|"|>,city:<|"|>Oslo<|"|>,n:3'),
                           specials) is not None  # fmt: skip
    assert grammar_accepts(lark, call('city:<|"|>Oslo<|"|>'), specials) is not None
    assert grammar_accepts(lark, call('n:3,city:<|"|>Oslo<|"|>'), specials) is not None
    endless = call('city:<|"|>Oslo<|"|>,n:' + "1" * 40)
    assert grammar_accepts(lark, endless, specials) is not None


BOUNDED = {"type": "function", "function": {"name": "w", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 4},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"]}}}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("google-gemma-4-31B-it.jinja", '<|tool_call>call:w{{city:<|"|>{}<|"|>,days:{}}}'
         "<tool_call|>"),
        ("MiniMax-M3.jinja", "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"w\">"
         "]<]minimax[>[<city>{}]<]minimax[>[</city>]<]minimax[>[<days>{}]<]minimax[>[</days>"
         "]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>"),
    ],
)  # fmt: skip
def test_dialect_grammar_bounds_values(name: str, call: str) -> None:
    """A string's maxLength and an integer's range hold in raw-text values too."""
    fmt = _dialect_format(name)
    named = named_token(fmt)
    specials = tuple(t for t in fmt.preserved_tokens if named(t))
    lark = dialect_grammar(fmt, [BOUNDED], "required", special=named)
    assert grammar_accepts(lark, call.format("Oslo", 7), specials) is None
    assert grammar_accepts(lark, call.format("Bergen", 7), specials) is not None
    assert grammar_accepts(lark, call.format("Oslo", 8), specials) is not None
