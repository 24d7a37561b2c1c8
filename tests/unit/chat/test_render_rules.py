"""The request-level rules of chat rendering, each against llama.cpp's recorded prompts
(tests/data/chat/render_cases.json) or llama-server's own tests: `enable_thinking` from
`--reasoning` and the template, overridden by the `enable_thinking` kwarg and by
`reasoning_effort: "none"`; the `tool_use` variant for requests with tools; a continued
assistant message whose parts are joined by a blank line; template refusals as 400s."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from functools import cache
from pathlib import Path

import pytest

from loraserve.chat.prompt import render_prompt
from loraserve.chat.render import Tokens
from loraserve.chat.template import ChatTemplate

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "chat"
sys.path.insert(0, str(ROOT / "scripts" / "chat_oracle"))
import fixtures  # noqa: E402

TOKENS = Tokens("<s>", "</s>")
USER = fixtures.FIXTURES["user"]


@cache
def _oracle() -> dict:
    return json.loads((DATA / "render_cases.json").read_text())


def _template(name: str) -> ChatTemplate:
    return ChatTemplate((DATA / "templates" / name).read_text(), False, "--chat-template-file")


def _llama(name: str, **case: object) -> str:
    """llama.cpp's prompt for the first recorded case matching `case`."""
    data = _oracle()
    t = data["templates"][name]
    i = next(i for i, c in enumerate(data["cases"]) if case.items() <= c.items())
    return t["prompts"][t["outputs"][t["out"][i]]["prompt"]]


def _render(name: str, **kw: object) -> str:
    now = datetime.fromisoformat(_oracle()["meta"]["now_utc"].replace("Z", ""))
    kw.setdefault("defaults", {"preserve_reasoning": True})  # llama-server's default kwargs
    return render_prompt(_template(name), TOKENS, USER, True, now=now, **kw)  # type: ignore[arg-type]


QWEN3, R1 = "Qwen-Qwen3-0.6B.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"


@pytest.mark.parametrize("name", [QWEN3, R1, "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"])
def test_reasoning_flag_sets_enable_thinking(name: str) -> None:
    """--reasoning auto on a thinking template = on = enable_thinking true; off = false."""
    on = _llama(name, fixture="user", tools=None, enable_thinking=True, add_generation_prompt=True)
    off = _llama(
        name, fixture="user", tools=None, enable_thinking=False, add_generation_prompt=True
    )
    assert on != off
    assert _render(name) == _render(name, reasoning="on") == on
    assert _render(name, reasoning="off") == off


def test_kwarg_and_reasoning_effort_override_the_flag() -> None:
    on = _llama(QWEN3, fixture="user", tools=None, enable_thinking=True, add_generation_prompt=True)
    off = _llama(
        QWEN3, fixture="user", tools=None, enable_thinking=False, add_generation_prompt=True
    )
    assert _render(QWEN3, kwargs={"enable_thinking": False}) == off
    assert _render(QWEN3, reasoning="off", kwargs={"enable_thinking": True}) == on
    assert (
        _render(QWEN3, defaults={"enable_thinking": False}, kwargs={"enable_thinking": True}) == on
    )
    assert _render(QWEN3, reasoning_effort="none") == off
    assert _render(QWEN3, reasoning_effort="high") == on
    with pytest.raises(ValueError, match='invalid type for "enable_thinking"'):  # a 400
        _render(QWEN3, kwargs={"enable_thinking": "false"})  # llama-server's message


def test_a_template_without_thinking_gets_it_off_by_default() -> None:
    """Llama 3.1 does not support thinking: auto passes enable_thinking false."""
    name = "meta-llama-Llama-3.1-8B-Instruct.jinja"
    assert not _template(name).supports_thinking(TOKENS)
    off = _llama(
        name, fixture="user", tools=None, enable_thinking=False, add_generation_prompt=True
    )
    assert _render(name) == off


def test_tools_select_the_tool_use_variant() -> None:
    """A model's `tool_use` template renders the requests with tools (llama.cpp's
    `common_chat_templates_apply_jinja`); the default one the others, tools [] included."""
    default, tool_use = (
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    )
    both = ChatTemplate(
        (DATA / "templates" / default).read_text(),
        False,
        "model",
        (DATA / "templates" / tool_use).read_text(),
    )
    tools = fixtures.TOOLS["two"]
    with_tools = render_prompt(both, TOKENS, USER, True, tools=tools)
    assert with_tools == _llama(tool_use, fixture="user", tools="two", tool_choice="auto")
    for none in (None, []):
        plain = render_prompt(both, TOKENS, USER, True, tools=none)
        assert plain == _llama(default, fixture="user", tools=None, enable_thinking=False)
    assert both.caps == _template(tool_use).caps  # /props reports the tool_use variant's


def test_prefill_parts_join_with_a_blank_line() -> None:
    """llama-server's test_chat_template_assistant_prefill: a continued assistant message of
    parts "Wh", "ill" ends the Llama 3.1 prompt with "Wh\\n\\nill"."""
    msgs = [
        {"role": "system", "content": "Book"},
        {"role": "user", "content": "What is the best book"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}],
        },
    ]
    out = render_prompt(
        _template("meta-llama-Llama-3.1-8B-Instruct.jinja"), TOKENS, msgs, False,
        continuation="auto",
    )  # fmt: skip
    assert out.endswith(
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nWh\n\nill"
    )


def test_a_template_refusal_is_a_400() -> None:
    """Gemma 2 refuses a conversation that does not alternate (llama.cpp's record: error)."""
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ValueError, match="Conversation roles must alternate"):
        render_prompt(_template("google-gemma-2-2b-it.jinja"), TOKENS, msgs, True)
