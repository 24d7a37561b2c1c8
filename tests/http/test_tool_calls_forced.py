"""Forced calls over HTTP on the tiny model for templates whose format llama-server finds
without tool calls (`chat.formats.forced`): DeepSeek R1 Distill Llama 8B (its DeepSeek
`<｜tool▁calls▁begin｜>` calls, after the reasoning its prompt opens), Granite 3.3 (the
`<|tool_call|>[..]` list its instructions describe) and Phi 3.5 (no call form: bare JSON).
`required` and a named function give calls whose arguments validate against the schema
(`jsonschema`), streamed = not streamed; `auto` answers plain content, as llama-server."""

from __future__ import annotations

import pytest

from tests.http.tool_call_util import chat, chat_stream, check_calls
from tests.server_util import serve_in_thread
from tests.unit.chat.format_util import TEMPLATES

NAMES = [
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
]


@pytest.fixture(scope="module", params=NAMES)
def srv(request):
    args = ["-np", "1", "-c", "8192", "--chat-template-file", str(TEMPLATES / request.param),
            "--reasoning-budget", "8"]  # fmt: skip
    with serve_in_thread(args) as s:
        yield s


def test_required_and_named_give_valid_calls(srv) -> None:
    choice = chat(srv, tool_choice="required", n_predict=256)["choices"][0]
    assert check_calls(choice)
    named = {"type": "function", "function": {"name": "add"}}
    calls = check_calls(chat(srv, tool_choice=named, n_predict=256)["choices"][0])
    assert calls and {c["function"]["name"] for c in calls} == {"add"}


def test_streamed_equals_unstreamed(srv) -> None:
    body = {"tool_choice": "required", "n_predict": 256, "parallel_tool_calls": False}
    whole = chat(srv, **body)["choices"][0]
    msg, finish = chat_stream(srv, **body)
    assert finish == whole["finish_reason"] == "tool_calls"
    want = [(c["function"]["name"], c["function"]["arguments"])
            for c in whole["message"]["tool_calls"]]  # fmt: skip
    assert [(c["name"], c["arguments"]) for c in msg["tool_calls"].values()] == want


def test_auto_is_plain_content(srv) -> None:
    choice = chat(srv, tool_choice="auto", n_predict=8)["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] != "tool_calls"
