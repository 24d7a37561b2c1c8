"""Prompts of assistant prefills that hold reasoning, byte-equal to llama-server's
(tests/data/chat/prefill_server.json, scripts/chat_oracle/record_prefill_server.py: the
peer's llama-server on Gemma 3 270M with each of the 70 templates, /apply-template).
render_cases.json's one prefill is content only; these are a last assistant message with
only `reasoning_content` (with and without tools, and with thinking off by the kwarg), and
with both reasoning and content, continued as llama-server continues it by default.
llama-server strips the template's leading BOS text (the vocabulary adds BOS), so both
sides are compared without it; a request the template refuses is refused by both."""

from __future__ import annotations

import json
import logging
from datetime import datetime

import pytest

from loraserve.chat.prompt import render_prompt
from loraserve.chat.render import Tokens
from loraserve.chat.template import ChatTemplate
from tests.unit.chat.format_util import DATA

ORACLE = json.loads((DATA / "prefill_server.json").read_text())
NOW = datetime.fromisoformat(ORACLE["meta"]["now_utc"].replace("Z", ""))  # the server's date


def test_every_template_is_recorded() -> None:
    assert len(ORACLE["templates"]) == 70


@pytest.mark.parametrize("name", sorted(ORACLE["templates"]))
def test_prefill_prompts_equal_llama_servers(name: str) -> None:
    t = ORACLE["templates"][name]
    template = ChatTemplate((DATA / "templates" / name).read_text(), False, "--chat-template-file")
    tokens = Tokens(t["bos_token"], t["eos_token"])
    logging.disable(logging.WARNING)
    try:
        for key, body in ORACLE["requests"].items():
            want = t[key]
            try:
                ours = render_prompt(template, tokens, body["messages"], False, None,
                                     body.get("chat_template_kwargs"), tools=body.get("tools"),
                                     continuation="auto", now=NOW)  # fmt: skip
            except ValueError as e:  # refused: llama-server must have refused too
                assert isinstance(want, dict), (key, e)
                continue
            assert not isinstance(want, dict), (key, want)
            bos = t["bos_token"]
            assert ours.removeprefix(bos) == want.removeprefix(bos), key
    finally:
        logging.disable(logging.NOTSET)
