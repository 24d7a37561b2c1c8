"""llama.cpp's built-in chat templates: every ported name renders what llama.cpp's
`llama_chat_apply_template` rendered (recorded by scripts/record_chat_templates.py), and the
server's template is resolved as llama-server resolves it (flag, model, fallback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraserve.chat.builtin import BUILTIN, render_builtin
from loraserve.chat.template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    render_prompt,
    resolve_chat_template,
)
from tests.server_util import tiny_model

DATA = Path(__file__).resolve().parents[2] / "data" / "chat_templates.json"
CASES = json.loads(DATA.read_text())["cases"]
REQUIRED = "chatml gemma llama2 llama3 mistral-v7 phi3 qwen deepseek".split()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['name']}-{len(c['messages'])}")
def test_builtin_equals_llama_cpp(case) -> None:
    assert render_builtin(case["name"], case["messages"], case["add_ass"]) == case["prompt"]


def test_every_ported_name_is_recorded_and_the_required_ones_exist() -> None:
    assert {c["name"] for c in CASES} == set(BUILTIN) - {"qwen"}
    assert set(REQUIRED) <= set(BUILTIN)
    chat = [{"role": "user", "content": "Hi"}]
    assert render_builtin("qwen", chat, True) == render_builtin("chatml", chat, True)


def test_resolution_order_and_fallback_warning() -> None:
    tok = tiny_model().tokenizer  # a llama vocabulary without a template
    assert tok.chat_template is None
    fallback, warning = resolve_chat_template(None, "", tok)
    assert fallback == ChatTemplate(CHATML_TEMPLATE, False, "fallback")
    assert warning is not None and "no chat template" in warning and "chatml" in warning
    named, warning = resolve_chat_template("llama3", "--chat-template", tok)
    assert named == ChatTemplate("llama3", True, "--chat-template") and warning is None
    text = "{{ messages[0].content }}|{{ greeting }}"
    filed, _ = resolve_chat_template(text, "--chat-template-file", tok)
    msgs = [{"role": "user", "content": "hi"}]
    assert render_prompt(filed, tok, msgs, True, {"greeting": "a"}, {"greeting": "b"}) == "hi|b"
    assert render_prompt(filed, tok, msgs, True, {"greeting": "a"}) == "hi|a"
    with pytest.raises(ValueError, match="content"):  # a 400 at the server
        render_prompt(named, tok, [{"role": "user"}], True)
