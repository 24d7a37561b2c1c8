"""Chat parsing settings over HTTP on the tiny model with Qwen3's template, as llama-server
reads them: the reasoning budget's message (`--reasoning-budget-message`, the request's
`reasoning_budget_message` over it) written before the forced `</think>`,
`thinking_budget_tokens` as another spelling of `reasoning_budget_tokens`,
`reasoning_format` deepseek (as auto) and deepseek-legacy (reasoning extracted in a whole
answer, left inline in a stream), and `--skip-chat-parsing` (everything is content: no
reasoning split, no tool calls, no tool grammar; a grammar beside tools is still a 400)."""

from __future__ import annotations

import json

import pytest

from tests.server_util import serve_in_thread
from tests.unit.chat.format_util import TEMPLATES

QWEN3 = str(TEMPLATES / "Qwen-Qwen3-0.6B.jinja")
USER = [{"role": "user", "content": "Weather in Paris?"}]
THINKING = [*USER, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
    "required": ["city"]}}}]  # fmt: skip
FLAG_MESSAGE = " Budget spent."


@pytest.fixture(scope="module")
def srv():
    args = ["-np", "1", "-c", "2048", "--chat-template-file", QWEN3,
            "--reasoning-budget-message", FLAG_MESSAGE]  # fmt: skip
    with serve_in_thread(args) as s:
        yield s


@pytest.fixture(scope="module")
def raw():
    args = ["-np", "1", "-c", "2048", "--chat-template-file", QWEN3, "--skip-chat-parsing"]
    with serve_in_thread(args) as s:
        yield s


def answer(s, **body) -> dict:
    body = {"messages": THINKING, "n_predict": 40, "temperature": 0, **body}
    r = s.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def streamed(s, **body) -> dict:
    body = {"messages": THINKING, "n_predict": 40, "temperature": 0, **body, "stream": True}
    msg = {"content": "", "reasoning_content": ""}
    with s.client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    for key in msg:
                        msg[key] += choice["delta"].get(key) or ""
    return msg


def test_budget_message_before_the_forced_end(srv) -> None:
    """After the budget's tokens the message, then `</think>`, are forced: the flag's
    message by default, the request's over it; the thought before it is the start of the
    free answer's (greedy)."""
    free = answer(srv, reasoning_format="none")["content"]
    assert "</think>" not in free
    flag = answer(srv, reasoning_format="none", reasoning_budget_tokens=4)["content"]
    own = answer(srv, reasoning_format="none", reasoning_budget_tokens=4,
                 reasoning_budget_message=" Stop now.")["content"]  # fmt: skip
    for text, message in ((flag, FLAG_MESSAGE), (own, " Stop now.")):
        thought, _, rest = text.partition(message.strip())
        assert rest.lstrip().startswith("</think>"), text
        assert free.startswith(thought.rstrip()) and len(thought) > len("<think>\nLet me")
    assert answer(srv, reasoning_format="none", thinking_budget_tokens=4)["content"] == flag


def test_deepseek_formats(srv) -> None:
    """deepseek answers as auto; deepseek-legacy too when whole, but a stream leaves the
    reasoning inline in `content` (llama-server's reasoning_in_content for streams)."""
    auto = answer(srv)
    assert auto["reasoning_content"].startswith("Let me") and not auto.get("content")
    assert answer(srv, reasoning_format="deepseek") == auto
    assert answer(srv, reasoning_format="deepseek-legacy") == auto
    stream = streamed(srv, reasoning_format="deepseek-legacy")
    assert stream["reasoning_content"] == ""
    assert "Let me" + stream["content"] == auto["reasoning_content"]
    assert streamed(srv, reasoning_format="deepseek") == {
        "content": "",
        "reasoning_content": auto["reasoning_content"].removeprefix("Let me"),
    }


def test_skip_chat_parsing_answers_plain_content(raw, srv) -> None:
    """No reasoning split and no tool calls: the prefilled message is dropped, as
    llama-server drops it (test_chat_skip_parsing_oracle), so the greedy text is the
    parsing server's answer to the user's turn with no generation prompt; tools under
    `required` are not forced (no grammar: the random model's text, never a call)."""
    plain = answer(raw)
    assert "reasoning_content" not in plain or not plain["reasoning_content"]
    assert plain["content"] and "</think>" not in plain["content"]
    bare = answer(srv, messages=USER, add_generation_prompt=False, reasoning_format="none")
    assert bare["content"] == plain["content"]
    called = answer(raw, messages=USER, tools=TOOLS, tool_choice="required")
    assert not called.get("tool_calls") and called["content"]
    # no budget set: the <think> block Qwen3's answer may open before the forced call gets
    # half of n_predict by default, and the call the other half
    forced = answer(srv, messages=USER, tools=TOOLS, tool_choice="required", n_predict=200)
    assert forced["tool_calls"][0]["function"]["name"] == "get_weather"
    body = {"messages": USER, "tools": TOOLS, "grammar": 'root ::= "x"'}
    assert raw.client.post("/v1/chat/completions", json=body).status_code == 400
