"""Dialect grammars after a reasoning prefill (a last assistant message with only
`reasoning_content`, continued as llama.cpp continues it: the generation prompt opens the
reasoning and writes the prefill). The answer starts inside the reasoning, so the grammar
takes its rest and its end marker before the call, as llama.cpp's grammar (built over the
generation prompt and the answer) does for Gemma 4, LFM2, MiniMax-M3 and Muse Glimmer.

Found over HTTP on the tiny model: `tool_choice: required` with such a prefill was a 500
("the grammar refused token") for Gemma 4, LFM2 and MiniMax-M3, whose grammars forced the
call at once while the reasoning budget forced the end marker; Muse's forced the call's
recipient into the reasoning message. And LFM2's calls as llama.cpp's
`python_style_tool_calls` takes them: `space` inside the parentheses, at least one argument
where the tool has any; ours keeps the schema's required ones, once each, in any order."""

from __future__ import annotations

import logging

import pytest

from loraserve.chat.formats.lead import opens_reasoning, turn_lead
from loraserve.chat.formats.special.grammars import dialect_grammar
from tests.unit.chat.format_util import TEMPLATES, assistant_text, grammar_accepts
from tests.unit.chat.oracle_util import template_format
from tests.unit.chat.roundtrip_util import TOOL, named_token, server_render

# template -> (what closes the opened reasoning, the prompt's end after a reasoning prefill)
OPENED = {
    "google-gemma-4-31B-it.jinja": ("<channel|>", "<|turn>model\n<|channel>thought\nLet me"),
    "LFM2.5-8B-A1B.jinja": ("</think>", "<|im_start|>assistant\n<think>Let me"),
    "MiniMax-M3.jinja": ("</mm:think>", "]~b]ai\n<mm:think>Let me"),
    "muse-glimmer.jinja": (
        "<|eom|><|start|>assistant", "<|start|>assistant to=self<|message|>Let me",
    ),
}  # fmt: skip


def _call_text(name: str, args: dict) -> str:
    src = (TEMPLATES / name).read_text()
    call = {"id": "abc123def", "type": "function",
            "function": {"name": "get_time", "arguments": args}}  # fmt: skip
    msg = {"role": "assistant", "content": "", "tool_calls": [call]}
    text = assistant_text(src, msg, [TOOL], server_render(src))
    return text.removeprefix("</mm:think>")  # MiniMax-M3's turn without reasoning


def _accepts(name: str, text: str, choice: str, thinking_open: bool) -> str | None:
    logging.disable(logging.WARNING)
    fmt = template_format(name)
    logging.disable(logging.NOTSET)
    named = named_token(fmt)
    lark = dialect_grammar(fmt, [TOOL], choice, False, thinking_open, named)
    assert lark is not None
    return grammar_accepts(lark, text, tuple(t for t in fmt.preserved_tokens if named(t)))


@pytest.mark.parametrize("name", sorted(OPENED))
def test_the_prompt_opens_the_reasoning(name: str) -> None:
    logging.disable(logging.WARNING)
    fmt = template_format(name)
    logging.disable(logging.NOTSET)
    end, prompt = OPENED[name]
    assert opens_reasoning(fmt, "<|im_start|>user\nHi" + prompt)
    assert not opens_reasoning(fmt, "<|im_start|>user\nHi" + prompt + " more" + end)


@pytest.mark.parametrize("name", sorted(OPENED))
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_reasoning_rest_then_the_call(name: str, choice: str) -> None:
    """The rest of the reasoning, its end, then the call: accepted where the prompt opened
    the reasoning; the bare call is not (`required`: the reasoning must end first)."""
    end, _ = OPENED[name]
    call = _call_text(name, {"city": "Oslo", "n": 3})
    assert _accepts(name, f" to think{end}{call}", choice, True) is None
    if choice == "required":
        assert _accepts(name, call, choice, True) is not None
        assert _accepts(name, call, choice, False) is None


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('[get_time(city="Oslo", n=3)]', True),
        ("[get_time(n=3, city='Oslo')]", True),  # any order, as llama.cpp's
        ('[get_time( city="Oslo",\nn=3 )]', True),  # `space` inside the parentheses
        ("[get_time(n=3)]", False),  # city is required
        ("[get_time()]", False),
        ('[get_time(city="Oslo", city="Rome", n=3)]', False),  # a required one twice
        ('[get_time(city="Oslo", n="3")]', False),  # n is an integer
    ],
)
def test_lfm2_arguments_as_the_schema(text: str, ok: bool) -> None:
    full = f"<|tool_call_start|>{text}<|tool_call_end|>"
    assert (_accepts("LFM2.5-8B-A1B.jinja", full, "required", False) is None) == ok


BOUNDED = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "maxLength": 5}, "unit": {"enum": ["c", "f"]}}}}}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "ok"),
    [
        ("city='Oslo', unit=\"c\"", True),
        ("city=\"Paris\", unit='f'", True),
        ("city='Berlin'", False),  # longer than maxLength
        ("city='Oslo', unit='k'", False),  # not in the enum
    ],
)
def test_lfm2_strings_as_the_schema_bounds_them(args: str, ok: bool) -> None:
    """maxLength and enum hold for LFM2's quoted strings too (they were any text: a random
    model wrote a string until the token limit)."""
    logging.disable(logging.WARNING)
    fmt = template_format("LFM2.5-8B-A1B.jinja")
    logging.disable(logging.NOTSET)
    named = named_token(fmt)
    lark = dialect_grammar(fmt, [BOUNDED], "required", False, False, named)
    assert lark is not None
    text = f"<|tool_call_start|>[get_weather({args})]<|tool_call_end|>"
    specials = tuple(t for t in fmt.preserved_tokens if named(t))
    assert (grammar_accepts(lark, text, specials) is None) == ok


@pytest.mark.parametrize(
    ("name", "prompt", "lead"),
    [
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",  # assistant marker:
         "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>Let me",  # <|START_RESPONSE|>
         "<|START_THINKING|>Let me"),
        ("Qwen-Qwen3-0.6B.jinja", "<|im_start|>assistant\n<think>\nLet me", "<think>\nLet me"),
    ],
)  # fmt: skip
def test_a_reasoning_prefill_leads_the_answer(name: str, prompt: str, lead: str) -> None:
    """The reasoning prefill is the answer's start (llama.cpp parses its generation prompt,
    reasoning start + prefill, with the answer), also where the analysed assistant marker is
    not in the prompt (Command R7B's is `<|START_RESPONSE|>`; was "": the prefill was lost)."""
    logging.disable(logging.WARNING)
    fmt = template_format(name)
    logging.disable(logging.NOTSET)
    full = "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>" + prompt
    assert turn_lead(fmt, full) == lead
    assert opens_reasoning(fmt, full)


@pytest.mark.parametrize(
    ("prompt", "reasoning", "content"),
    [
        ("Assistant: <think><think>Let me", "Let me sunny", ""),
        ("Assistant: <think><think>\n</think>It is", "", "It is sunny"),
    ],
)
def test_rwkv_worlds_doubled_reasoning_start(prompt: str, reasoning: str, content: str) -> None:
    """RWKV World's template writes `Assistant: <think>` without the generation prompt too
    (its add_generation_prompt defaults to true), so a prefill's prompt opens the reasoning
    twice; llama.cpp's generation prompt (a render diff) holds one, and parses as here (the
    reasoning was `<think>Let me sunny`, and `<think>` for the content prefill)."""
    from loraserve.chat.formats.parse import ChatParser

    logging.disable(logging.WARNING)
    fmt = template_format("llama-cpp-rwkv-world.jinja")
    logging.disable(logging.NOTSET)
    full = "User: Hi\n\n" + prompt
    lead = turn_lead(fmt, full)
    msg = ChatParser(fmt, None, "auto", False, lead).parse(" sunny", partial=False)
    assert (msg.reasoning_content, msg.content) == (reasoning, content)
