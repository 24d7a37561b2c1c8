"""The web UI's agent loop in headless Chromium: with `--tools`, the chat offers the
server's tools to the model, runs the call it makes with the real `POST /tools`, shows the
tool's answer and sends it back as a `tool` message; without tools nothing changes.

The model's two answers are scripted (playwright fulfils /v1/chat/completions: a random tiny
model would not call a tool); everything else is the real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server_util import Served, serve_in_thread
from tests.webui_util import Page, require_browser

require_browser()
ARGS = '{"path": "hello.txt"}'


def sse(*events: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


CALL = sse(
    {"choices": [{"index": 0, "finish_reason": None, "delta": {"role": "assistant", "tool_calls": [
        {"index": 0, "id": "call_abc", "type": "function",
         "function": {"name": "read_file", "arguments": ARGS}}]}}]},
    {"choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {}}]},
)  # fmt: skip
ANSWER = sse(
    {"choices": [{"index": 0, "finish_reason": None, "delta": {"content": "It says hi."}}]},
    {"choices": [{"index": 0, "finish_reason": "stop", "delta": {}}]},
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("agent-root")
    (root / "hello.txt").write_text("hi from the file\n")
    with serve_in_thread(["--tools", "read_file", "--tools-root", str(root), "-np", "1"]) as s:
        yield s


def test_agent_runs_the_tool_call_and_answers_again(browser: Any, srv: Served) -> None:
    ui = Page(browser, srv.url)
    answers = [CALL, ANSWER]
    ui.page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, content_type="text/event-stream", body=answers.pop(0)
        ),
    )
    try:
        pg = ui.open("Chat")
        box = pg.get_by_label("Message", exact=True)
        box.fill("What does hello.txt say?")
        box.press("Enter")
        pg.wait_for_selector("li.msg.assistant:not([aria-busy]) .content:has-text('It says hi.')")
        assert ui.bodies("/tools") == [{"tool": "read_file", "params": {"path": "hello.txt"}}]
        assert pg.locator("li.msg.tool .role").text_content() == "tool read_file"
        assert pg.locator("li.msg.tool .content").inner_text().strip() == "hi from the file"
        first, second = ui.bodies("/v1/chat/completions")
        assert [t["function"]["name"] for t in first["tools"]] == ["read_file"]
        assert second["messages"] == [
            {"role": "user", "content": "What does hello.txt say?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": ARGS},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_abc", "content": "hi from the file\n"},
        ]
        assert not ui.errors
    finally:
        ui.close()


def test_no_tools_no_change(browser: Any, tmp_path: Path) -> None:
    with serve_in_thread(["-np", "1"]) as s:
        ui = Page(browser, s.url)
        try:
            pg = ui.open("Chat")
            box = pg.get_by_label("Message", exact=True)
            box.fill("Hello")
            box.press("Enter")
            pg.wait_for_selector("li.msg.assistant:not([aria-busy]) .info-mix")
            (body,) = ui.bodies("/v1/chat/completions")
            assert "tools" not in body and body["messages"] == [
                {"role": "user", "content": "Hello"}
            ]
        finally:
            ui.close()
