"""A template no detector or analysis finds a tool-call format in (one of a user's own, not
in llama.cpp's directory): with tools, `auto` answers plain content and `required` a bare
JSON call valid for the schema, never a 500, and the server warns once for the template,
not once a request."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jsonschema
import pytest

from tests.server_util import serve_in_thread

TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
          "required": ["city"], "additionalProperties": False}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
USER = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    path = Path(tmp_path_factory.mktemp("tpl")) / "own.jinja"
    path.write_text(TEMPLATE)
    with serve_in_thread(["-np", "1", "-c", "2048", "--chat-template-file", str(path)]) as s:
        yield s


def test_tools_on_an_unknown_template(srv, caplog: pytest.LogCaptureFixture) -> None:
    body = {"messages": USER, "tools": TOOLS, "n_predict": 8, "temperature": 0}
    with caplog.at_level(logging.WARNING, logger="loraserve.server.tool_calls"):
        for _ in range(2):
            r = srv.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            msg = r.json()["choices"][0]["message"]
            assert "tool_calls" not in msg and isinstance(msg["content"], str)
        forced = {**body, "tool_choice": "required", "n_predict": 320, "parallel_tool_calls": False}
        r = srv.client.post("/v1/chat/completions", json=forced)
    assert r.status_code == 200, r.text
    (call,) = r.json()["choices"][0]["message"]["tool_calls"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)
    warned = [rec for rec in caplog.records if "no tool-call format" in rec.getMessage()]
    assert len(warned) == 1
