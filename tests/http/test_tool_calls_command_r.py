"""Command R+'s tool-use template over HTTP, as llama-server answers it: a tool with an
array parameter makes the template type `json_spec.items`, a dict's built-in method in
llama.cpp's engine, whose attribute is an error, so llama-server answers 400 ("Unable to
generate parser for this template ... Function has no builtins", recorded in
tests/data/chat/render_cases.json) and so does loraserve (the template's error named);
tools with scalar parameters render, and a forced call comes back in the template's
`Action:\\n```json` list, valid for the schema."""

from __future__ import annotations

import pytest

from tests.http.tool_call_util import TOOLS, USER, chat, check_calls
from tests.server_util import serve_in_thread
from tests.unit.chat.format_util import TEMPLATES

NAME = "CohereForAI-c4ai-command-r-plus-tool_use.jinja"
TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}
ARRAY_TOOL = {"type": "function", "function": {"name": "tag", "parameters": TAGS}}


@pytest.fixture(scope="module")
def srv():
    args = ["-np", "1", "-c", "8192", "--chat-template-file", str(TEMPLATES / NAME)]
    with serve_in_thread(args) as s:
        yield s


def test_array_parameter_is_the_templates_400(srv) -> None:
    body = {"messages": USER, "tools": [*TOOLS, ARRAY_TOOL], "n_predict": 4}
    r = srv.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "Function has no builtins" in r.text, r.text


def test_scalar_tools_give_a_valid_forced_call(srv) -> None:
    choice = chat(srv, tool_choice="required", n_predict=256, parallel_tool_calls=False)
    choice = choice["choices"][0]
    assert len(check_calls(choice)) == 1 and choice["finish_reason"] == "tool_calls"
