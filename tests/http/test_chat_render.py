"""Chat rendering through the server, on the tiny model with Qwen3's template: `/props`
reports llama-server's `chat_template_caps`, `/apply-template` takes `tools` and renders
llama.cpp's prompt (tests/data/chat/render_cases.json), `--reasoning off` and
`reasoning_effort: "none"` turn thinking off, `--no-prefill-assistant` renders a last
assistant message as a whole turn (else it is continued, as llama.cpp's record)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.server_util import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "chat"
sys.path.insert(0, str(ROOT / "scripts" / "chat_oracle"))
import fixtures  # noqa: E402

NAME = "Qwen-Qwen3-0.6B.jinja"
TEMPLATE = str(DATA / "templates" / NAME)


def _llama(**case: object) -> str:
    data = json.loads((DATA / "render_cases.json").read_text())
    t = data["templates"][NAME]
    i = next(i for i, c in enumerate(data["cases"]) if case.items() <= c.items())
    return t["prompts"][t["outputs"][t["out"][i]]["prompt"]]


def test_props_and_apply_template_render_as_llama_server() -> None:
    oracle = json.loads((DATA / "render_cases.json").read_text())["templates"][NAME]
    tools = fixtures.TOOLS["two"]
    user, prefill = fixtures.FIXTURES["user"], fixtures.FIXTURES["prefill"]
    on = dict(fixture="user", add_generation_prompt=True, enable_thinking=True)
    off = {**on, "enable_thinking": False}
    args = ["--chat-template-file", TEMPLATE, "-np", "1", "-c", "256"]
    with serve_in_thread(args) as s:
        assert s.client.get("/props").json()["chat_template_caps"] == oracle["caps"]

        def prompt(messages: list = user, **body: object) -> str:
            r = s.client.post("/apply-template", json={"messages": messages, **body})
            assert r.status_code == 200, r.text
            return r.json()["prompt"]

        assert prompt(tools=tools) == _llama(**on, tools="two", tool_choice="auto")
        assert prompt() == _llama(**on, tools=None)
        assert prompt(reasoning_effort="none") == _llama(**off, tools=None)
        cont = dict(fixture="prefill", enable_thinking=True, continue_final_message="auto")
        assert prompt(prefill) == _llama(**cont)
        assert prompt(prefill).endswith("The weather in Paris is")
        bad = s.client.post("/apply-template", json={"messages": user, "tools": [{}]})
        assert bad.status_code == 400 and "tools[0]" in bad.json()["error"]["message"]
        # the chat package refuses with a ValueError; the server answers llama-server's 400
        kw = {"enable_thinking": "false"}
        bad = s.client.post("/apply-template", json={"messages": user, "chat_template_kwargs": kw})
        assert bad.status_code == 400 and "enable_thinking" in bad.json()["error"]["message"]
        bad = s.client.post("/v1/chat/completions", json={"messages": [{"role": "user"}]})
        assert bad.status_code == 400, bad.text
    with serve_in_thread([*args, "-rea", "off", "--no-prefill-assistant"]) as s:
        r = s.client.post("/apply-template", json={"messages": user})
        assert r.json()["prompt"] == _llama(**off, tools=None)
        whole = s.client.post("/apply-template", json={"messages": prefill}).json()["prompt"]
        assert "The weather in Paris is<|im_end|>\n<|im_start|>assistant\n" in whole
