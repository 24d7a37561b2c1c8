"""Answers to assistant prefills parse as llama.cpp parses them, for all 70 templates
(tests/data/chat/prefill_parse.json, scripts/chat_oracle/record_prefill_parse.py): a last
assistant message with reasoning only (with and without tools, with thinking off by the
kwarg) or with reasoning and content, continued as llama-server continues it; the prompt
is llama.cpp's, byte for byte, and the answer (" sunny", and " sunny" + the end tag +
" Done.") read by the parser the server sets up from that prompt (`plan_reply`: the turn's
lead, whether the prompt left reasoning open) gives llama.cpp's message, which parses its
generation prompt + the answer.

Templates that write the reasoning opener themselves without the generation prompt (RWKV
World: `Assistant: <think>`, or `<think>\\n</think>` with thinking off, because llama.cpp
leaves `add_generation_prompt` undefined and the template defaults it to true) open it
twice in a prefill's prompt; llama.cpp's generation prompt, a render diff, holds only the
continuation's opener. With thinking off the old special case (two openers in a row) missed
the closed block before the prefill's opener (RWKV World; GLM 4.7, Laguna and Spark, whose
generation prompt is `</think>` then), and the prefill and answer were content. Muse
Glimmer's continued answer lost the prefill's reasoning (its ` to=self` message before the
answer's is part of the turn).

Named exception: with thinking off, llama.cpp's DeepSeek V3.2/V4 and MiniMax-M3 parsers
consume a reasoning block without extracting it (`p.until(THINK_END)`, no `p.reasoning`), so
a reasoning prefill and the model's continuation of it vanish from the answer (V3.2 and
MiniMax-M3 answer '' for " sunny"; V4, whose block with thinking off is a bare `</think>`,
answers `<think>Let me sunny` as content); ours answers them as `reasoning_content`."""

from __future__ import annotations

import json
import logging
from datetime import datetime

import pytest

from loraserve.chat.formats.lead import opens_reasoning, turn_lead
from loraserve.chat.formats.parse import ChatParser
from loraserve.chat.prompt import render_prompt
from loraserve.chat.render import Tokens, select_source
from loraserve.chat.template import ChatTemplate
from tests.unit.chat.format_util import DATA

ORACLE = json.loads((DATA / "prefill_parse.json").read_text())
NOW = datetime.fromisoformat(ORACLE["meta"]["now_utc"].replace("Z", ""))
TOKENS = Tokens(ORACLE["meta"]["bos_token"], ORACLE["meta"]["eos_token"])
CASES = [
    (name, key) for name, t in sorted(ORACLE["templates"].items()) if "error" not in t
    for key, got in t.items() if "error" not in got
]  # fmt: skip


DROPS = {
    (n, "reasoning_off")
    for n in (
        "deepseek-ai-DeepSeek-V3.2.jinja",
        "MiniMax-M3.jinja",
        "deepseek-ai-DeepSeek-V4.jinja",
        "deepseek-ai-DeepSeek-V4-Flash-0731.jinja",
    )
}


def _msg(m) -> tuple:  # noqa: ANN001 - ChatMessage | dict
    if isinstance(m, dict):
        calls = [(c["name"], json.loads(c["arguments"])) for c in m["tool_calls"]]
        return m["content"].strip(), m["reasoning_content"].strip(), calls
    calls = [(c.name, json.loads(c.arguments)) for c in m.tool_calls]
    return m.content.strip(), m.reasoning_content.strip(), calls


def _parser(name: str, key: str) -> tuple[str, ChatParser]:
    """The prompt and the answer's parser, set up as `tool_calls.plan_reply` sets it up."""
    body = ORACLE["requests"][key]
    template = ChatTemplate((DATA / "templates" / name).read_text(), False, "file")
    tools = body.get("tools")
    fmt = template.chat_format(select_source(template.source, template.tool_use, tools), TOKENS)
    kwargs = {"preserve_reasoning": True, **body.get("chat_template_kwargs", {})}
    prompt = render_prompt(template, TOKENS, body["messages"], False, None, kwargs,
                           tools=tools, continuation="auto", now=NOW)  # fmt: skip
    continued = body["messages"][-1].get("content") or ""
    lead = turn_lead(fmt, prompt, continued)
    trigger = fmt.trigger.strip()
    if not lead and trigger and prompt.rstrip().endswith(trigger):
        lead = trigger
    opened = opens_reasoning(fmt, prompt) and not lead
    active = tools if fmt.has_tools else None
    return prompt, ChatParser(fmt, active, "deepseek", opened, lead)


def test_every_template_is_recorded() -> None:
    assert len(ORACLE["templates"]) == 70 and len(CASES) >= 270


@pytest.mark.parametrize(("name", "key"), CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_prefill_answers_parse_as_llama_cpps(name: str, key: str) -> None:
    got = ORACLE["templates"][name][key]
    logging.disable(logging.WARNING)
    try:
        prompt, parser = _parser(name, key)
    finally:
        logging.disable(logging.NOTSET)
    assert prompt == got["prompt"]
    for text, want in zip(ORACLE["outputs"], got["parsed"], strict=True):
        if want is None or "error" in want:  # no end tag; or llama.cpp fails on the text
            continue
        ends = got["thinking_end_tags"]
        text = text.replace("{end}", ends[0]) if ends else text
        mine = _msg(parser.parse(text, False))
        if (name, key) in DROPS:  # llama.cpp drops the reasoning; ours keeps it
            assert _msg(want)[1] == "" and mine[1] == "Let me sunny", (mine, want)
            continue
        assert mine == _msg(want), text
