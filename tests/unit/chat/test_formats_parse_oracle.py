"""The parser against llama.cpp's own parses (tests/data/chat/parse_cases.json: the 463 PEG
cases of its tests/test-chat.cpp, recorded by scripts/chat_oracle): each case's model
output, after the part of the generation prompt llama.cpp parses with it, gives the
message llama.cpp's test expects or llama.cpp's own parse of it (content and reasoning
compared stripped, arguments as JSON), whole; the parser is set up from the whole prompt the
server renders for the case's request, as the server sets it up; and fed byte by byte,
the stream's deltas only grow and add up to it."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraserve.chat.formats.parse import ChatParser
from loraserve.chat.formats.stream import MessageStream
from tests.unit.chat.oracle_util import (
    CASES,
    case_parser,
    norm_message,
    parsed_message,
    template_format,
)

# Templates whose every case must agree (P0 and P1 formats the descriptions cover).
EXACT = {
    "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-QwQ-32B.jinja", "Qwen3-Coder.jinja",
    "Qwen3.5-4B.jinja", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "StepFun3.5-Flash.jinja",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek-ai-DeepSeek-V3.1.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja", "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "Kimi-K2-Thinking.jinja", "Kimi-K2-Instruct.jinja", "moonshotai-Kimi-K2.jinja",
    "MiniMax-M2.jinja", "GLM-4.6.jinja", "unsloth-mistral-Devstral-Small-2507.jinja",
    "llama-cpp-deepseek-r1.jinja", "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "fireworks-ai-llama-3-firefunction-v2.jinja", "meetkai-functionary-medium-v3.1.jinja",
    "google-gemma-4-31B-it.jinja", "deepseek-ai-DeepSeek-V3.2.jinja",
    "deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja",
    "LFM2-8B-A1B.jinja", "LFM2.5-8B-A1B.jinja", "LFM2.5-Instruct.jinja", "MiniMax-M3.jinja",
    "Kimi-K3.jinja", "inclusionai-ling-3.0-flash.jinja", "GigaChat3-10B-A1.8B.jinja",
    "meetkai-functionary-medium-v3.2.jinja", "muse-glimmer.jinja", "Cohere2MoE.jinja",
    "openbmb-MiniCPM5-1B.jinja", "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja", "NVIDIA-Nemotron-Nano-v2.jinja",
    "ByteDance-Seed-OSS.jinja",
}  # fmt: skip
FLOOR = 463  # of 463


def test_parses_equal_llama_cpps() -> None:
    logging.disable(logging.WARNING)
    try:
        agree, total, wrong = Counter(), Counter(), {}
        for case in CASES:
            total[case["template"]] += 1
            mine = parsed_message(case_parser(case), case["input"], case["is_partial"])
            answers = (
                norm_message(case["expect"]),
                norm_message(case.get("parsed", case["expect"])),
            )
            if norm_message(mine) in answers:  # the test's expectation, or llama.cpp's own parse
                agree[case["template"]] += 1
            elif case["template"] in EXACT:
                wrong[case["id"]] = (
                    case["input"],
                    norm_message(mine),
                    norm_message(case["expect"]),
                )
    finally:
        logging.disable(logging.NOTSET)
    assert not wrong, wrong
    assert sum(agree.values()) >= FLOOR, (sum(agree.values()), sorted(total - agree))


def test_streams_grow_and_add_up() -> None:
    """Every whole case (all 70 templates' formats), fed one character at a time; a
    continued message's deltas start after its prefill's own parse."""
    for case in CASES:
        if case["is_partial"]:
            continue
        parser = case_parser(case)
        stream = MessageStream(
            parser, continuation=case["request"]["continue_final_message"] != "none"
        )
        content, reasoning = stream.sent.content, stream.sent.reasoning_content  # a prefill's
        deltas = [d for ch in case["input"] for d in stream.feed(ch)] + stream.finish()
        final = stream.final
        assert final is not None
        assert content + "".join(d.get("content", "") for d in deltas) == final.content
        reasoning += "".join(d.get("reasoning_content", "") for d in deltas)
        assert reasoning == final.reasoning_content
        args: dict[int, str] = {}
        for d in deltas:
            for c in d.get("tool_calls", []):
                args[c["index"]] = args.get(c["index"], "") + c["function"].get("arguments", "")
        assert [args[i] for i in sorted(args)] == [c.arguments for c in final.tool_calls]


MARKERS = ['<|"|>', "｜DSML｜", "]<]minimax[>[", "<|sep|>", "<|open|>", "<|close|>", "to=",
           "<|message|>", "<|eom|>", ">>>", "\\u", "\\", '"', "'", "{", "}", "[", "]", "(", ")",
           ":", ",", "=", "<", ">", "</", "\n", "True", "null"]  # fmt: skip


EDIT = st.tuples(st.floats(0, 1), st.sampled_from(MARKERS), st.booleans())


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(CASES), st.lists(EDIT, min_size=1, max_size=3))
def test_mangled_answers_never_raise(case: dict, edits: list) -> None:
    """A case's answer with markers inserted or text cut out still parses, whole and as
    every prefix, without an exception (a model's odd output is content, never a 500)."""
    text = case["input"]
    for where, marker, insert in edits:
        k = int(where * len(text))
        text = text[:k] + marker + text[k:] if insert else text[:k] + text[k + len(marker) :]
    logging.disable(logging.WARNING)
    try:
        parser = case_parser(case)
        for k in range(0, len(text) + 1, max(1, len(text) // 16)):
            parser.parse(text[:k], True)
        parser.parse(text, False)
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", '<tool_call>\n{"na\\_me": "f", "arguments": {}}'),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", '<tool_call>\n{"name": "f\\_", "arguments": {}}'),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", '<tool_call>\n{"name": "f", "arguments": "{\\_"}'),
        ("Cohere2MoE.jinja", '<|START_ACTION|>[{"tool_call_id": "0", "tool_\\uname": "f"}]'),
        ("LFM2-8B-A1B.jinja", '<|tool_call_start|>[f(code="\\uzzzz")]<|tool_call_end|>'),
    ],
)
def test_invalid_escapes_are_no_call(name: str, text: str) -> None:
    """JSON (or Python) strings with escapes their grammar has not: no call, no exception."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    parser = ChatParser(template_format(name), tools)
    for partial in (True, False):
        assert parser.parse(text, partial).tool_calls == [] or partial
