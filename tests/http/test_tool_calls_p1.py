"""Tool calling over HTTP on the tiny model for the issue's P1 templates (Mistral Nemo,
Small 3.2, Devstral, Ministral 3, gpt-oss harmony, DeepSeek V3.1, GLM 4.6/4.7, Kimi K2,
MiniMax M2, Gemma 4, DeepSeek V3.2) and the P0 ones test_tool_calls.py does not run
(Qwen3-Coder and Qwen3.5 XML, DeepSeek R1 Distill Qwen, QwQ, Qwen2.5, Hermes 3, Llama 3.3):
`required` and a
named function give calls whose arguments validate against the tool's schema (`jsonschema`
is the oracle) with no text before them, streamed answers equal unstreamed ones, `none`
answers text, `parallel_tool_calls: false` gives one call, tools on /v1/messages and
/v1/responses, and the official `openai` client reads the calls and sends a second turn
with the tool's result, which the template renders."""

from __future__ import annotations

import json

import jsonschema
import pytest

from loraserve.chat.formats.detect import detect
from loraserve.chat.formats.grammar import tool_grammar
from loraserve.chat.formats.lead import opens_reasoning
from loraserve.chat.render import RenderInputs, Tokens, render
from tests.http.tool_call_util import (
    SCHEMAS,
    TOOLS,
    USER,
    chat,
    chat_stream,
    check_calls,
    openai_second_turn,
)
from tests.server_util import serve_in_thread
from tests.unit.chat.format_util import TEMPLATES, render_for

P1 = [
    "google-gemma-4-31B-it.jinja",
    "deepseek-ai-DeepSeek-V3.2.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "unsloth-mistral-Devstral-Small-2507.jinja",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "openai-gpt-oss-120b.jinja",
    "deepseek-ai-DeepSeek-V3.1.jinja",
    "GLM-4.6.jinja",
    "GLM-4.7-Flash.jinja",
    "moonshotai-Kimi-K2.jinja",
    "Kimi-K2-Thinking.jinja",
    "MiniMax-M2.jinja",
]
P0 = [
    "Qwen3-Coder.jinja",
    "Qwen3.5-4B.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "Qwen-QwQ-32B.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
]


BUDGET = 8  # reasoning tokens before the end marker is forced (the tiny model never ends it)
N = 512  # the tiny vocabulary spells markers such as <｜DSML｜invoke name=".."> byte by byte


@pytest.fixture(scope="module", params=P1 + P0)
def srv(request):
    source = (TEMPLATES / request.param).read_text()
    fmt = detect(source, render_for(source))
    if tool_grammar(fmt, TOOLS, "required") is None:
        pytest.skip("no tool-call grammar for the template's format")
    args = ["-np", "1", "-c", "16384", "--chat-template-file", str(TEMPLATES / request.param),
            "--reasoning-budget", str(BUDGET)]  # fmt: skip
    with serve_in_thread(args) as s:
        s.template_name = request.param
        yield s


def forced(srv, **body) -> dict:
    """The answer under tool_choice required."""
    return chat(srv, tool_choice="required", **{"n_predict": N, **body})["choices"][0]


def test_required_gives_valid_calls(srv) -> None:
    choice = forced(srv)
    calls = check_calls(choice)
    assert calls
    assert choice["message"]["content"] in (None, "")


def test_named_function_is_called(srv) -> None:
    res = chat(srv, tool_choice={"type": "function", "function": {"name": "add"}}, n_predict=N)
    calls = check_calls(res["choices"][0])
    assert calls and {c["function"]["name"] for c in calls} == {"add"}


def test_parallel_false_gives_one_call(srv) -> None:
    choice = forced(srv, parallel_tool_calls=False)
    assert len(check_calls(choice)) == 1


def test_streamed_equals_unstreamed(srv) -> None:
    """One call (a random model writes parallel calls until the token limit cuts one)."""
    whole = forced(srv, parallel_tool_calls=False)
    msg, finish = chat_stream(srv, tool_choice="required", parallel_tool_calls=False, n_predict=N)
    assert finish == whole["finish_reason"] == "tool_calls"
    want = [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]
    ]
    assert [(c["name"], c["arguments"]) for c in msg["tool_calls"].values()] == want
    assert msg["content"] == (whole["message"]["content"] or "")
    assert msg["reasoning_content"] == (whole["message"].get("reasoning_content") or "")


def test_none_answers_text(srv) -> None:
    choice = chat(srv, tool_choice="none", n_predict=8)["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] != "tool_calls"


def test_openai_client_second_turn(srv) -> None:
    """The client's own message objects round-trip: the call goes back into the history
    with the tool's result, and the template renders it (the prompt grows by the call)."""
    openai_second_turn(srv, N, render=True)


def test_responses_function_tools(srv) -> None:
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    body = {"input": USER[0]["content"], "tools": tools, "tool_choice": "required",
            "max_output_tokens": N, "temperature": 0, "parallel_tool_calls": False}  # fmt: skip
    res = srv.client.post("/v1/responses", json=body).json()
    calls = [o for o in res["output"] if o["type"] == "function_call"]
    assert calls, res
    for c in calls:
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def test_messages_tool_use(srv) -> None:
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]  # fmt: skip
    body = {"messages": USER, "tools": tools, "max_tokens": N, "temperature": 0,
            "thinking": {"type": "enabled", "budget_tokens": BUDGET},
            "tool_choice": {"type": "tool", "name": "get_weather",
                            "disable_parallel_tool_use": True}}  # fmt: skip
    res = srv.client.post("/v1/messages", json=body).json()
    uses = [b for b in res["content"] if b["type"] == "tool_use"]
    assert len(uses) == 1 and res["stop_reason"] == "tool_use", res
    for block in uses:
        assert block["name"] == "get_weather"
        jsonschema.validate(block["input"], SCHEMAS["get_weather"])


def test_prefilled_trigger_constrains_the_rest_of_the_call(srv) -> None:
    """tool_choice auto: an assistant prefill ending in the format's trigger makes the
    answer the rest of a call, constrained and parsed with the prefill."""
    source = (TEMPLATES / srv.template_name).read_text()
    fmt = detect(source, render_for(source))
    if not fmt.trigger.strip() and fmt.dialect != "harmony":
        pytest.skip("no trigger marker: Llama 3.x's calls are bare JSON")
    if not fmt.trigger.strip():
        # gpt-oss, for any model: a prefill continues the body of a final-channel message
        # (the prompt ends `<|channel|>final<|message|>` + prefill, as llama.cpp's gpt-oss
        # parser writes its generation prompt), while a call's recipient ` to=functions.X`
        # sits in a message header, which only a message's `tool_calls` render: no
        # assistant prefill can open a call: its text stays the answer's content
        head = " to=functions.get_weather"
        msgs = [*USER, {"role": "assistant", "content": head}]
        r = srv.client.post("/apply-template", json={"messages": msgs, "tools": TOOLS})
        assert r.json()["prompt"].endswith("<|channel|>final<|message|>" + head)
        res = chat(srv, messages=msgs, tool_choice="auto", n_predict=4)
        msg = res["choices"][0]["message"]
        assert not msg.get("tool_calls") and msg["content"].startswith(head)
        return
    msgs = [*USER, {"role": "assistant", "content": fmt.trigger}]
    res = chat(srv, messages=msgs, tool_choice="auto", parallel_tool_calls=False, n_predict=N)
    choice = res["choices"][0]
    assert check_calls(choice) and choice["finish_reason"] == "tool_calls"


def test_reasoning_formats(srv) -> None:
    """Where the prompt opens reasoning (the generation prompt, else a reasoning prefill:
    the continued message's `reasoning_content`), the budget ends it and the call follows:
    the reasoning is `reasoning_content` by default and under deepseek, and stays in the
    content with its end marker under none (as llama.cpp's parse cases); the calls are the
    same."""
    source = (TEMPLATES / srv.template_name).read_text()
    fmt = detect(source, render_for(source))
    msgs = USER
    auto = forced(srv, parallel_tool_calls=False)["message"]
    prompt = render(source, Tokens("<s>", "</s>"), RenderInputs(USER, tools=TOOLS))
    opened = opens_reasoning(fmt, prompt)
    if auto.get("reasoning_content") and not opened:  # a block the answer opened itself
        # (issue 26: allowed before a forced call as llama.cpp's grammar allows it; under
        # none there is no reasoning rule, so the call comes first)
        none = forced(srv, reasoning_format="none", parallel_tool_calls=False)["message"]
        assert not none.get("content") and check_calls(
            {"message": none, "finish_reason": "tool_calls"}
        )
    if not opened:
        if not fmt.has_reasoning:
            pytest.skip("the template has no reasoning markers")
        msgs = [*USER, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]
        auto = forced(srv, messages=msgs, parallel_tool_calls=False)["message"]
        assert auto["reasoning_content"].startswith("Let me")
    body = {"messages": msgs, "parallel_tool_calls": False}
    deepseek = forced(srv, reasoning_format="deepseek", **body)["message"]
    none = forced(srv, reasoning_format="none", **body)["message"]
    assert deepseek == {**auto, "tool_calls": deepseek["tool_calls"]}
    calls = [[(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
             for m in (auto, deepseek, none)]  # fmt: skip
    assert calls[0] == calls[1] == calls[2] and calls[0]
    assert "reasoning_content" not in none
    assert auto["reasoning_content"] in none["content"]
    assert fmt.reasoning_end.strip() in none["content"]


def test_prefill_is_part_of_the_message(srv) -> None:
    """A last assistant message is continued: its text is the answer's start in the whole
    message (llama.cpp parses the generation prompt with the answer), whether or not the
    format has an assistant marker to find it by (Mistral's has none), and the stream's
    deltas start after the prefill as the prompt wrote it (a template may trim its space):
    the prefill is not sent again."""
    msgs = [*USER, {"role": "assistant", "content": "Hello, "}]
    whole = chat(srv, messages=msgs, tool_choice="none", n_predict=4)["choices"][0]["message"]
    streamed, _ = chat_stream(srv, messages=msgs, tool_choice="none", n_predict=4)
    text, tail = whole["content"], streamed["content"]
    assert tail and text.endswith(tail) and text[: len(text) - len(tail)] in ("Hello,", "Hello, ")
