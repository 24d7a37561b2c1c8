"""llama.cpp's own parses of its chat-format cases (tests/data/chat/parse_cases.json, the PEG
cases of its tests/test-chat.cpp) and how the server would set each case up: the format a
template's description gives, the prompt it renders, the parser it builds."""

from __future__ import annotations

import functools
import json
import logging

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.detect import detect
from loraserve.chat.formats.lead import opens_reasoning, turn_lead
from loraserve.chat.formats.parse import ChatParser
from loraserve.chat.render import RenderInputs, Tokens, render, select_source
from tests.unit.chat.format_util import DATA, TEMPLATES

CASES = json.loads((DATA / "parse_cases.json").read_text())["cases"]


@functools.cache
def template_format(name: str) -> ChatFormat:
    """The format our detection describes for a template of the sdist (its warnings about what
    a template lacks silenced: the tests assert on the format)."""
    src = (TEMPLATES / name).read_text()
    tokens = Tokens("<s>", "</s>")

    def run(msgs: list, tools: list | None, gen: bool, think: bool) -> str:
        inp = RenderInputs(msgs, tools=tools, add_generation_prompt=gen, enable_thinking=think)
        return render(src, tokens, inp)

    logging.disable(logging.WARNING)
    try:
        return detect(src, run)
    finally:
        logging.disable(logging.NOTSET)


def case_prompt(case: dict, fmt: ChatFormat) -> str:
    """The whole prompt the server renders for the case's request; its recorded generation
    prompt when our render does not end with it."""
    req = case["request"]
    gp = case["params"]["generation_prompt"]
    inp = RenderInputs(
        req["messages"], tools=req["tools"], add_generation_prompt=req["add_generation_prompt"],
        continuation=req["continue_final_message"], enable_thinking=req["enable_thinking"],
        reasoning_markers=(fmt.reasoning_start, fmt.reasoning_end),
    )  # fmt: skip
    src = select_source((TEMPLATES / case["template"]).read_text(), None, req["tools"])
    try:
        prompt = render(src, Tokens("<s>", "</s>"), inp)
    except ValueError:
        return gp
    return prompt if prompt.endswith(gp) else gp


def continued_text(req: dict) -> str:
    """The final assistant message a request continues, or empty."""
    last = req["messages"][-1]
    cont = req["continue_final_message"] != "none" and last["role"] == "assistant"
    return last.get("content") or "" if cont else ""


def case_parser(case: dict) -> ChatParser:
    """The case's parser, set up from the prompt as the server sets it up (`plan_reply`)."""
    fmt = template_format(case["template"])
    req = case["request"]
    tools = req["tools"] if req["tool_choice"] != "none" else None
    prompt = case_prompt(case, fmt)
    lead = turn_lead(fmt, prompt, continued_text(req))
    opened = opens_reasoning(fmt, prompt) and not lead
    schema = bool(req.get("json_schema"))
    return ChatParser(fmt, tools, req["reasoning_format"], opened, lead, response_format=schema)


def norm_message(msg: dict) -> tuple:
    """A message as compared: content and reasoning stripped, arguments as JSON."""
    calls = []
    for c in msg["tool_calls"]:
        try:
            args = json.loads(c["arguments"])
        except ValueError:
            args = c["arguments"]
        calls.append((c["name"], args, c.get("id") or ""))
    return msg["content"].strip(), msg["reasoning_content"].strip(), calls


def parsed_message(parser: ChatParser, text: str, partial: bool) -> dict:
    """Our parse of text as a dict in the recorded cases' shape."""
    m = parser.parse(text, partial)
    calls = [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in m.tool_calls]
    return {"content": m.content, "reasoning_content": m.reasoning_content, "tool_calls": calls}
