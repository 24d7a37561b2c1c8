"""`tool_choice` required / a named function after a reasoning block the answer opens itself
(issue 26 item 4: the call is forced "right after any reasoning").

llama.cpp's `required` grammar is `reasoning? content? calls`, fed the generation prompt:
a thinking template whose generation prompt does not open reasoning (Qwen3, Gemma 4,
Kimi K2 Thinking, GLM-4.6, Seed-OSS, Ministral 3 Reasoning, MiniMax-M3, LFM2.5, Command
R7B, Muse Glimmer) may still write one block before the call. Ours refused any block the
prompt had not opened, so those models could not think at all under `required`. For every
such template with tool calls: the assistant turn the template writes for a message with
reasoning_content and a call parses back to both, and the grammar of `required` and of the
named function accepts it, with the markers as text and as special tokens; the reasoning
budget ends such a block and the grammar accepts what follows; text before the call (outside
reasoning), a second block, and (reasoning_format none: no reasoning rule, as llama.cpp's)
the block itself stay refused.
"""

from __future__ import annotations

import functools
import logging

import pytest

from loraserve.chat.formats.budget import budget_markers
from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.lead import closes_reasoning, opens_reasoning
from loraserve.chat.formats.parse import ChatParser
from loraserve.engine.budget import BudgetSpec, ReasoningBudget
from loraserve.server.reasoning_budget import Budget, budget_spec
from tests.unit.chat.format_util import TEMPLATES, assistant_text, grammar_accepts
from tests.unit.chat.oracle_util import template_format
from tests.unit.chat.roundtrip_util import named_token, server_render

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
CALL = {"id": "abc123def", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}  # fmt: skip
THOUGHT = "I should call it."
USER = [{"role": "user", "content": "Weather in Paris?"}]
FAMILIES = {
    "Qwen-Qwen3-0.6B.jinja", "google-gemma-4-31B-it.jinja", "Kimi-K2-Thinking.jinja",
    "GLM-4.6.jinja", "ByteDance-Seed-OSS.jinja", "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "MiniMax-M3.jinja", "LFM2.5-8B-A1B.jinja", "muse-glimmer.jinja",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
}  # fmt: skip


class _Bytes:
    """A tokenizer whose tokens are the text's bytes (special tokens spelled as text)."""

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list:
        return list(text.encode())


@functools.cache
def _case(name: str) -> tuple[str, str] | None:
    """(the generation prompt, the answer the template writes: its reasoning, then the call),
    or None where the prompt opens or closes the reasoning itself or the turn holds none."""
    logging.disable(logging.WARNING)
    try:
        fmt = template_format(name)
        if not fmt.has_tools or fmt.dialect == "harmony" or budget_markers(fmt) is None:
            return None  # gpt-oss: its analysis message (test_tool_grammar)
        src = (TEMPLATES / name).read_text()
        render = server_render(src)
        prompt = render(USER, [TOOL], True, True)
        msg = {"role": "assistant", "content": "", "reasoning_content": THOUGHT,
               "tool_calls": [CALL]}  # fmt: skip
        text = assistant_text(src, msg, [TOOL], render)
    except Exception:  # noqa: BLE001 - a template that refuses the fixture has no case
        return None
    finally:
        logging.disable(logging.NOTSET)
    if opens_reasoning(fmt, prompt) or closes_reasoning(fmt, prompt):
        return None
    start = budget_markers(fmt).start  # type: ignore[union-attr]
    return (prompt, text) if start.strip() in text and THOUGHT in text else None


NAMES = [p.name for p in sorted(TEMPLATES.glob("*.jinja")) if _case(p.name)]


def _grammar(name: str, choice: str, reasoning: bool = True, named: bool = False) -> str:
    fmt = template_format(name)
    special = named_token(fmt) if named else (lambda m: False)
    lark = tool_grammar(fmt, [TOOL], choice, True, reasoning, False, special)
    assert lark is not None
    return lark


def _specials(name: str) -> tuple[str, ...]:
    fmt, named = template_format(name), named_token(template_format(name))
    return tuple(sorted({t for t in fmt.preserved_tokens if named(t)}, key=len)[::-1])


def test_every_family_is_checked() -> None:
    assert set(NAMES) >= FAMILIES, set(FAMILIES) - set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_reasoning_then_call_parses_and_passes_the_grammar(name: str) -> None:
    _, text = _case(name)  # type: ignore[misc]
    got = ChatParser(template_format(name), [TOOL]).parse(text, partial=False)
    assert got.reasoning_content.strip() == THOUGHT, (text, got)
    assert [c.name for c in got.tool_calls] == ["get_weather"], (text, got)
    assert not got.content.strip(), (text, got)
    for choice in ("required", "get_weather"):
        assert grammar_accepts(_grammar(name, choice), text) is None, (choice, text)
        specials = _specials(name)
        lark = _grammar(name, choice, named=True)
        assert grammar_accepts(lark, text, specials) is None, (choice, text, lark)


@pytest.mark.parametrize("name", NAMES)
def test_text_before_the_call_stays_refused(name: str) -> None:
    _, text = _case(name)  # type: ignore[misc]
    end = budget_markers(template_format(name)).ends[0].strip()  # type: ignore[union-attr]
    cut = text.index(end) + len(end)
    block, call = text[:cut], text[cut:]
    lark = _grammar(name, "required")
    for bad in (
        "Sure, let me check." + call,
        block + "Sure, let me check. " + call.lstrip(),
        block + block + call,
    ):
        assert grammar_accepts(lark, bad) is not None, bad
    # reasoning_format none: no reasoning rule (llama.cpp's), so the block is refused too
    assert grammar_accepts(_grammar(name, "required", reasoning=False), text) is not None


@pytest.mark.parametrize("name", NAMES)
def test_the_budget_ends_the_block_before_the_call(name: str) -> None:
    prompt, text = _case(name)  # type: ignore[misc]
    fmt = template_format(name)
    spec = budget_spec(_Bytes(), fmt, prompt, Budget(6))
    assert spec is not None and not spec.counting
    start = budget_markers(fmt).start  # type: ignore[union-attr]
    head = text[: text.index(start.strip()) + len(start.strip())]
    b, out = ReasoningBudget(spec, lambda t: bytes([t])), []
    for t in (head + "a long line of thought that goes on").encode():
        tok = b.forced if b.forced is not None else t
        out.append(tok)
        b.accept(tok)
        if b.forced is None and bytes(out).endswith(bytes(spec.forced)):
            break
    forced = bytes(spec.forced).decode()
    written = bytes(out).decode()
    assert written.endswith(forced) and len(written) < len(head) + 6 + len(forced) + 1
    end = budget_markers(fmt).ends[0].strip()  # type: ignore[union-attr]
    rest = text[text.index(end) + len(end) :]
    answer = written + rest
    assert grammar_accepts(_grammar(name, "required"), answer) is None, answer
    got = ChatParser(fmt, [TOOL]).parse(answer, partial=False)
    assert [c.name for c in got.tool_calls] == ["get_weather"], (answer, got)


def test_a_text_marker_arms_the_budget_in_any_tokenization() -> None:
    """A vocabulary without `<think>` as one token (the tiny test model): the grammar holds
    the marker as text and the model may write it in other pieces than the tokenizer's
    (`<th` + `ink>`), which must still arm the budget and end the block (the forced call's
    own reasoning on the tiny model ran to max_tokens before); llama.cpp's matching of the
    token sequences alone stays where a marker is one token (`by_text` off)."""
    pieces = {1: b"<", 2: b"think", 3: b">", 4: b"<th", 5: b"ink>", 6: b"a", 7: b"</think>"}
    for by_text, arms in ((True, True), (False, False)):
        spec = BudgetSpec(2, ((1, 2, 3),), ((7,),), (7,), False, by_text)
        b = ReasoningBudget(spec, pieces.__getitem__)
        for t in (4, 5, 6, 6):
            b.accept(t)
        assert (b.forced == 7) is arms
