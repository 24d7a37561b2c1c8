"""Tool calling and reasoning over HTTP on the tiny model (a random model: the schemas bound
every string and number, else it writes digits until the token limit), with the Qwen3 (Hermes
`<tool_call>` JSON, `<think>`) and Llama 3.1 (bare JSON) templates of llama.cpp's
models/templates: `required` and a named function give calls whose arguments validate
against the tool's schema (`jsonschema` is the oracle), streamed answers equal unstreamed
ones, `none` answers text, `parallel_tool_calls: false` gives one call, reasoning formats,
a grammar beside tools is a 400, and the official `openai` client reads the calls and sends
a second turn with the tool's result."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.http.tool_call_util import (
    N_PREDICT,
    SCHEMAS,
    TOOLS,
    USER,
    chat,
    chat_stream,
    check_calls,
    openai_second_turn,
)
from tests.server_util import serve_in_thread
from tests.unit.chat.format_util import TEMPLATES

QWEN3, LLAMA31 = "Qwen-Qwen3-0.6B.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja"


@pytest.fixture(scope="module", params=[QWEN3, LLAMA31])
def srv(request):
    # no --reasoning-budget: the reasoning block Qwen3's answer may open before a forced call
    # (issue 26, as llama.cpp's grammar allows it; the random model never ends it itself)
    # gets half of max_tokens by default, so the call keeps the other half
    args = ["-np", "2", "-c", "8192", "--chat-template-file", str(TEMPLATES / request.param)]
    with serve_in_thread(args) as s:
        s.template_name = request.param
        yield s


def test_required_gives_valid_calls(srv) -> None:
    res = chat(srv, tool_choice="required")
    choice = res["choices"][0]
    calls = check_calls(choice)
    assert calls
    assert choice["message"]["content"] in (None, "")


def test_named_function_is_called(srv) -> None:
    res = chat(srv, tool_choice={"type": "function", "function": {"name": "add"}})
    calls = check_calls(res["choices"][0])
    assert calls and {c["function"]["name"] for c in calls} == {"add"}


def test_parallel_false_gives_one_call(srv) -> None:
    res = chat(srv, tool_choice="required", parallel_tool_calls=False)
    assert len(check_calls(res["choices"][0])) == 1


@pytest.mark.parametrize("parallel", [False, True])
def test_streamed_equals_unstreamed(srv, parallel: bool) -> None:
    # with parallel calls the random model writes calls until its token limit: the call the
    # limit cuts is in both answers with its arguments so far, and both finish on "length"
    whole = chat(srv, tool_choice="required", parallel_tool_calls=parallel)["choices"][0]
    msg, finish = chat_stream(srv, tool_choice="required", parallel_tool_calls=parallel)
    assert finish == whole["finish_reason"] in ("tool_calls", "length")
    assert finish == "tool_calls" or parallel
    want = [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]
    ]
    assert [(c["name"], c["arguments"]) for c in msg["tool_calls"].values()] == want
    assert msg["content"] == (whole["message"]["content"] or "")


def test_none_answers_text(srv) -> None:
    choice = chat(srv, tool_choice="none", n_predict=8)["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] != "tool_calls"


def test_grammar_with_tools_is_400(srv) -> None:
    body = {"messages": USER, "tools": TOOLS, "tool_choice": "auto", "grammar": 'root ::= "a"'}
    r = srv.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "grammar" in r.text


def test_unknown_named_function_is_400(srv) -> None:
    body = {"messages": USER, "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "nope"}}}  # fmt: skip
    assert srv.client.post("/v1/chat/completions", json=body).status_code == 400


def test_reasoning_formats(srv) -> None:
    """Continuing an assistant's reasoning leaves the answer in it. As llama-server parses
    the turn's start with the answer (llama.cpp's parse cases 1 and 21): by default the
    prefill's text and the answer are `reasoning_content`; with reasoning_format none the
    whole turn is the content, its `<think>` included; a stream does not send the prefill
    again (Qwen3 only: Llama 3.1's template has no reasoning markers)."""
    if srv.template_name != QWEN3:
        pytest.skip("the Llama 3.1 template has no reasoning markers")
    msgs = [*USER, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]
    body = {"messages": msgs, "n_predict": 12, "temperature": 0}
    auto = srv.client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    none = srv.client.post(
        "/v1/chat/completions", json={**body, "reasoning_format": "none"}
    ).json()["choices"][0]["message"]
    assert "reasoning_content" not in none
    text = none["content"]
    assert text.startswith("<think>") and "Let me" in text
    if "</think>" not in text:
        assert auto["reasoning_content"] == text.removeprefix("<think>").strip()
        assert not auto["content"]
    msg, _ = chat_stream(srv, **body, tools=None)
    assert "Let me" + msg["reasoning_content"] == auto["reasoning_content"]


def test_openai_client_second_turn(srv) -> None:
    openai_second_turn(srv, N_PREDICT)


def test_responses_function_tools(srv) -> None:
    """/v1/responses: flat function tools, `function_call` items (whole and streamed)."""
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    body = {
        "input": USER[0]["content"],
        "tools": tools,
        "tool_choice": "required",
        "max_output_tokens": N_PREDICT,
        "temperature": 0,
        "parallel_tool_calls": False,
    }  # one call: see test_streamed_equals_unstreamed
    res = srv.client.post("/v1/responses", json=body).json()
    calls = [o for o in res["output"] if o["type"] == "function_call"]
    assert calls, res
    for c in calls:
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
    with srv.client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    events = [json.loads(ln[6:]) for ln in lines]
    args: dict[str, str] = {}
    for e in events:
        if e["type"] == "response.function_call_arguments.delta":
            args[e["item_id"]] = args.get(e["item_id"], "") + e["delta"]
    final = events[-1]["response"]["output"]
    streamed = [o for o in final if o["type"] == "function_call"]
    assert [(c["name"], c["arguments"]) for c in streamed] == [
        (c["name"], c["arguments"]) for c in calls
    ]
    assert [args[c["id"]] for c in streamed] == [c["arguments"] for c in streamed]


def test_messages_tools_in_the_models_format(srv) -> None:
    """/v1/messages: a forced call comes back as a tool_use block valid for its schema."""
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]  # fmt: skip
    body = {"messages": USER, "tools": tools, "max_tokens": N_PREDICT, "temperature": 0,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}  # fmt: skip
    res = srv.client.post("/v1/messages", json=body).json()
    *thinking, block = res["content"]  # Qwen3's own reasoning block may come first
    assert [b["type"] for b in thinking] in ([], ["thinking"]), res
    assert block["type"] == "tool_use" and res["stop_reason"] == "tool_use"
    jsonschema.validate(block["input"], SCHEMAS[block["name"]])


def test_reasoning_off_by_effort_or_budget(srv) -> None:
    """`reasoning_effort: "none"` and `reasoning_budget_tokens: 0` render the prompt with
    thinking off (Qwen3's template then closes an empty <think> block), like
    chat_template_kwargs enable_thinking false."""
    if srv.template_name != QWEN3:
        pytest.skip("the Llama 3.1 template has no reasoning markers")

    def prompt_tokens(**kw) -> int:
        body = {"messages": USER, "n_predict": 1, **kw}
        return srv.client.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]

    off = prompt_tokens(chat_template_kwargs={"enable_thinking": False})
    assert off > prompt_tokens()
    assert prompt_tokens(reasoning_effort="none") == off
    assert prompt_tokens(reasoning_budget_tokens=0) == off


def test_prefilled_trigger_constrains_the_rest_of_the_call(srv) -> None:
    """tool_choice auto: an assistant prefill ending in the format's trigger (Qwen3's
    `<tool_call>`) makes the answer the rest of a call, constrained and parsed with it."""
    if srv.template_name != QWEN3:
        pytest.skip("the Llama 3.1 format has no trigger marker")
    msgs = [*USER, {"role": "assistant", "content": "<tool_call>\n"}]
    res = chat(srv, messages=msgs, tool_choice="auto", parallel_tool_calls=False)
    choice = res["choices"][0]
    assert check_calls(choice) and choice["finish_reason"] == "tool_calls"


def test_reasoning_budget_forces_the_end_marker(srv) -> None:
    """`reasoning_budget_tokens`: inside reasoning the prompt opened (a prefilled
    reasoning_content), the end marker is forced after that many tokens; the greedy answer
    under a small budget is a prefix of the one under a larger budget, and without a budget
    (no tools: no forced call's default) the random model never ends its reasoning."""
    if srv.template_name != QWEN3:
        pytest.skip("the Llama 3.1 template has no reasoning markers")
    msgs = [*USER, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]

    def turn(budget: int) -> str:
        body = {"messages": msgs, "n_predict": 40, "temperature": 0, "reasoning_format": "none",
                "reasoning_budget_tokens": budget}  # fmt: skip
        res = srv.client.post("/v1/chat/completions", json=body).json()
        return res["choices"][0]["message"]["content"]

    free, short, longer = turn(-1), turn(3), turn(9)
    assert "</think>" not in free
    assert "</think>" in short and "</think>" in longer
    thought = [t[: t.index("</think>")].rstrip() for t in (short, longer)]
    assert thought[0] != thought[1] and thought[1].startswith(thought[0])
    assert free.startswith(thought[1])
