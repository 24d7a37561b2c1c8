"""Chat prompts byte-equal to llama.cpp's: every template of the peer's models/templates x
every request case of tests/data/chat/render_cases.json (recorded from llama.cpp's
`common_chat_templates_apply` by scripts/chat_oracle/record.py), rendered through
`ChatTemplate.render` as the server renders; and the template capabilities (`/props`
`chat_template_caps`) and the `enable_thinking` default equal llama.cpp's.

A case the template refuses (its `raise_exception`: Gemma 2 and alternating roles, Llama 3.x
and two parallel calls; an engine error: Command R+'s tool-use template types an array
parameter through `json_spec.items`, a dict's built-in method in llama.cpp's engine, whose
attribute is an error there, "Unable to generate parser for this template ... Function has
no builtins") must be refused by both; there are no exceptions.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from functools import cache
from pathlib import Path

import pytest

from loraserve.chat.caps import detect_caps
from loraserve.chat.render import Tokens
from loraserve.chat.template import ChatTemplate

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "chat"
sys.path.insert(0, str(ROOT / "scripts" / "chat_oracle"))
import fixtures  # noqa: E402 - the recorder's own request builder

CONTINUATION = {
    None: "none",
    "auto": "auto",
    "content": "content",
    "reasoning_content": "reasoning",
}


@cache
def _oracle() -> dict:
    return json.loads((DATA / "render_cases.json").read_text())


def _names() -> list[str]:
    return sorted(_oracle()["templates"])


def _template(name: str) -> ChatTemplate:
    return ChatTemplate((DATA / "templates" / name).read_text(), False, "--chat-template-file")


def test_the_oracle_covers_every_template() -> None:
    assert len(_names()) == 70
    assert len(_oracle()["cases"]) >= 77


@pytest.mark.parametrize("name", _names())
def test_prompts_equal_llama_cpp(name: str) -> None:
    data = _oracle()
    meta, t = data["meta"], data["templates"][name]
    tokens = Tokens(meta["bos_token"], meta["eos_token"])
    now = datetime.fromisoformat(meta["now_utc"].replace("Z", ""))  # TZ=UTC when recorded
    template = _template(name)
    logging.disable(logging.WARNING)
    try:
        for i, case in enumerate(data["cases"]):
            out = t["outputs"][t["out"][i]]
            req = fixtures.request(case)
            try:
                ours = template.render(
                    tokens,
                    req["messages"],
                    case["add_generation_prompt"],
                    req.get("chat_template_kwargs"),
                    tools=req.get("tools"),
                    continuation=CONTINUATION[case["continue_final_message"]],
                    enable_thinking=case["enable_thinking"],
                    now=now,
                )
            except ValueError as e:  # the template refused: llama.cpp's must have too
                assert "error" in out, (i, case, e)
                continue
            assert "error" not in out, (i, case, out)
            assert ours == t["prompts"][out["prompt"]], f"case {i}: {case}"
    finally:
        logging.disable(logging.NOTSET)


def test_caps_and_thinking_default_equal_llama_cpp() -> None:
    tokens = Tokens("<s>", "</s>")
    logging.disable(logging.WARNING)
    try:
        for name in _names():
            t = _oracle()["templates"][name]
            source = (DATA / "templates" / name).read_text()
            assert detect_caps(source).to_map() == t["caps"], name
            assert _template(name).supports_thinking(tokens) == t["supports_enable_thinking"], name
    finally:
        logging.disable(logging.NOTSET)
