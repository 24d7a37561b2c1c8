"""Tagged arguments as llama.cpp's grammars take them: an optional argument may come any
number of times (`repeat(space + any_optional, 0, -1)` in the autoparser, DeepSeek's DSML
and MiniMax-M3; `zero_or_more` in Qwen3-Coder, Ling 3, Kimi K3, MiniCPM5 and Muse), the
required ones once; up to `optional_runs` optional ones in a row (each once and four
more), so a random model repeating a key still ends the call. Each template writes the
call itself (keys renamed afterwards, as a dict cannot hold one twice); the `required`
grammar accepts the repeats and refuses a required argument written twice, and the parser
keeps every occurrence in order.

Ours keeps each required argument exactly once where llama.cpp's MiniCPM5, Kimi K3 and Muse
grammars let them be left out or repeat (the tool's `required` holds): those refusals are
ours, the others llama.cpp's too."""

from __future__ import annotations

import json
import logging

import pytest

from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.parse import ChatParser
from loraserve.chat.formats.special.grammars import dialect_grammar
from loraserve.chat.formats.special.lark import named, optional_runs
from tests.unit.chat.format_util import TEMPLATES, assistant_text, grammar_accepts
from tests.unit.chat.oracle_util import template_format
from tests.unit.chat.roundtrip_util import named_token, server_render

TOOL = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "required": ["city"],
    "properties": {"city": {"type": "string"}, "unit": {"type": "string"},
                   "days": {"type": "integer"}}}}}  # fmt: skip
TAGGED = [
    "GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "ByteDance-Seed-OSS.jinja", "MiniMax-M2.jinja",
    "Spark2.5.jinja", "tencent-Hy3.jinja", "poolside-Laguna-XS.2.jinja", "Qwen3-Coder.jinja",
    "Qwen3.5-4B.jinja", "StepFun3.5-Flash.jinja", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
    "openbmb-MiniCPM5-1B.jinja", "deepseek-ai-DeepSeek-V3.2.jinja", "deepseek-ai-DeepSeek-V4.jinja",
    "Kimi-K3.jinja", "MiniMax-M3.jinja", "inclusionai-ling-3.0-flash.jinja", "muse-glimmer.jinja",
]  # fmt: skip


def _call_text(name: str, args: dict) -> str:
    """The call as the template writes it, keys `zz<key>` (`zzzz<key>`..) renamed `<key>`."""
    src = (TEMPLATES / name).read_text()
    call = {"id": "abc123def", "type": "function",
            "function": {"name": "weather", "arguments": args}}  # fmt: skip
    msg = {"role": "assistant", "content": "", "tool_calls": [call]}
    return assistant_text(src, msg, [TOOL], server_render(src)).replace("zz", "")


def _accepts(name: str, text: str) -> str | None:
    logging.disable(logging.WARNING)
    fmt = template_format(name)
    logging.disable(logging.NOTSET)
    special = named_token(fmt)
    if fmt.dialect:
        lark = dialect_grammar(fmt, [TOOL], "required", special=special)
    else:
        lark = tool_grammar(fmt, [TOOL], "required", thinking_open=False, special=special)
    assert lark is not None
    body = text[text.find(fmt.trigger.strip()) :] if fmt.trigger else text
    specials = tuple(t for t in fmt.preserved_tokens if named(t)) if fmt.dialect else ()
    return grammar_accepts(lark, body, specials)


@pytest.mark.parametrize("name", TAGGED)
def test_optional_arguments_repeat(name: str) -> None:
    args = {"city": "Paris", "unit": "c", "days": 2, "zzunit": "f", "zzdays": 3}
    text = _call_text(name, args)
    assert _accepts(name, text) is None, text
    (call,) = ChatParser(template_format(name), [TOOL]).parse(text, partial=False).tool_calls
    assert call.arguments == '{"city": "Paris", "unit": "c", "days": 2, "unit": "f", "days": 3}'


@pytest.mark.parametrize("name", TAGGED)
def test_required_argument_only_once(name: str) -> None:
    text = _call_text(name, {"city": "Paris", "zzcity": "Rome"})
    assert _accepts(name, text) is not None, text


@pytest.mark.parametrize("name", TAGGED)
def test_required_argument_present(name: str) -> None:
    text = _call_text(name, {"unit": "c"})
    assert _accepts(name, text) is not None, text


@pytest.mark.parametrize("name", TAGGED)
def test_optional_runs_are_bounded(name: str) -> None:
    """Up to `optional_runs` optional arguments after the required ones (two optional
    ones: six), so a model repeating a key reaches the call's end."""
    assert optional_runs(2) == 6
    six = {"city": "Paris", "unit": "c", "days": 2, "zzunit": "f", "zzdays": 3,
           "zzzzunit": "c", "zzzzdays": 4}  # fmt: skip
    assert _accepts(name, _call_text(name, six)) is None
    assert _accepts(name, _call_text(name, {**six, "zzzzzzunit": "f"})) is not None


@pytest.mark.parametrize(
    "name", ["deepseek-ai-DeepSeek-V3.2.jinja", "deepseek-ai-DeepSeek-V4.jinja"]
)
def test_dsml_spacing_is_llama_cpps_space(name: str) -> None:
    """DSML: `space` (none, or a bounded run of blanks) after each argument, as llama.cpp's
    grammar; the template writes one newline."""
    text = _call_text(name, {"city": "Paris", "unit": "c", "days": 2})
    between = "parameter>\n<｜DSML｜"  # after an argument
    assert _accepts(name, text.replace(between, "parameter><｜DSML｜")) is None
    assert _accepts(name, text.replace(between, "parameter>\n\n  <｜DSML｜")) is None


TWO = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "required": ["city", "day"],
    "properties": {"city": {"type": "string"}, "day": {"type": "string"},
                   "unit": {"type": "string"}}}}}  # fmt: skip
# llama.cpp's grammars: `zero_or_more` of any argument (Kimi K3, Muse, MiniCPM5); the
# required ones permuted, then the optional ones (Qwen3-Coder's family, Ling 3); else the
# required ones in the schema's order, then the optional ones
ANY_ORDER = {"Kimi-K3.jinja", "muse-glimmer.jinja", "openbmb-MiniCPM5-1B.jinja"}
PERMUTED = {
    "Qwen3-Coder.jinja", "Qwen3.5-4B.jinja", "StepFun3.5-Flash.jinja",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "inclusionai-ling-3.0-flash.jinja",
}  # fmt: skip


def _two_text(name: str, args: dict) -> str:
    src = (TEMPLATES / name).read_text()
    call = {"id": "abc123def", "type": "function",
            "function": {"name": "weather", "arguments": args}}  # fmt: skip
    msg = {"role": "assistant", "content": "", "tool_calls": [call]}
    return assistant_text(src, msg, [TWO], server_render(src))


def _two_accepts(name: str, text: str) -> str | None:
    logging.disable(logging.WARNING)
    fmt = template_format(name)
    logging.disable(logging.NOTSET)
    special = named_token(fmt)
    if fmt.dialect:
        lark = dialect_grammar(fmt, [TWO], "required", special=special)
    else:
        lark = tool_grammar(fmt, [TWO], "required", thinking_open=False, special=special)
    assert lark is not None
    body = text[text.find(fmt.trigger.strip()) :] if fmt.trigger else text
    specials = tuple(t for t in fmt.preserved_tokens if named(t)) if fmt.dialect else ()
    return grammar_accepts(lark, body, specials)


@pytest.mark.parametrize("name", TAGGED)
def test_argument_order_as_llama_cpps_grammar(name: str) -> None:
    """The required arguments out of the schema's order, and an optional one before or
    between them, where llama.cpp's grammar for the format takes them; the schema's order
    everywhere; each text parses to its call."""
    in_order = {"city": "Paris", "day": "mon", "unit": "c"}
    swapped = {"day": "mon", "city": "Paris", "unit": "c"}
    first = {"unit": "c", "day": "mon", "city": "Paris"}
    between = {"city": "Paris", "unit": "c", "day": "mon"}
    assert _two_accepts(name, _two_text(name, in_order)) is None
    takes_swapped = name in ANY_ORDER or name in PERMUTED
    for args, takes in ((swapped, takes_swapped), (first, name in ANY_ORDER),
                        (between, name in ANY_ORDER)):  # fmt: skip
        text = _two_text(name, args)
        assert (_two_accepts(name, text) is None) == takes, (args, text)
        (call,) = ChatParser(template_format(name), [TWO]).parse(text, partial=False).tool_calls
        assert json.loads(call.arguments) == args


def test_bound_is_never_reached_in_llama_cpps_cases() -> None:
    """The bound on optional runs is not observable on anything llama.cpp recorded: of the
    calls in its parse cases (test-chat.cpp), none writes an optional argument twice, so
    every one stays under `optional_runs` (the whole-call grammar tests accept them all);
    the bound only ends a call whose model keeps repeating a key."""
    from collections import Counter

    from tests.unit.chat.oracle_util import CASES

    calls, most = 0, 0
    for case in CASES:
        if case["is_partial"]:
            continue
        tools = case["request"]["tools"] or []
        schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
        for call in case["expect"]["tool_calls"]:
            pairs = json.loads(call["arguments"] or "{}", object_pairs_hook=lambda p: p)
            params = schemas.get(call["name"]) or {}
            required = set(params.get("required") or [])
            props = [k for k in params.get("properties") or {} if k not in required]
            optional = [k for k, _ in pairs if k not in required]
            assert len(optional) <= optional_runs(len(props)), (case["id"], call)
            assert max(Counter(k for k, _ in pairs).values(), default=1) == 1
            most, calls = max(most, len(optional) - len(props)), calls + 1
    assert calls >= 300 and most == 0
