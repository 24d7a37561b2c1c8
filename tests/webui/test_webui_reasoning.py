"""The web UI shows a thinking model's reasoning apart from its answer, in headless Chromium
(Debian's `chromium` driven by playwright, no browser download), against the tiny model
served with DeepSeek R1's template, whose generation prompt opens `<think>`: the reasoning
budget ends it after a few tokens, and the UI's folded "Reasoning" box holds exactly the
`reasoning_content` the API answers for the same request, the message text none of it.

Skips only when chromium or playwright is missing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server_util import Served, serve_in_thread
from tests.unit.chat.format_util import TEMPLATES
from tests.webui_util import Page, require_browser

require_browser()
TEMPLATE = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"


@pytest.fixture(scope="module")
def srv() -> Iterator[Served]:
    args = ["-np", "1", "-c", "1024", "--temp", "0", "-n", "24", "--reasoning-budget", "6",
            "--chat-template-file", str(TEMPLATE)]  # fmt: skip
    with serve_in_thread(args) as s:
        yield s


def test_reasoning_is_shown_apart_from_the_answer(ui: Page, srv: Served) -> None:
    pg = ui.open("Chat")
    box = pg.get_by_label("Message", exact=True)
    box.fill("Why is the sky blue?")
    box.press("Enter")
    pg.wait_for_selector("li.msg.assistant:not([aria-busy]) .info-mix")
    (body,) = ui.bodies("/v1/chat/completions")
    want = srv.client.post("/v1/chat/completions", json={**body, "stream": False}).json()
    msg = want["choices"][0]["message"]
    assert msg["reasoning_content"], msg  # the prompt opened reasoning; the budget ended it
    answer = pg.locator("li.msg.assistant")
    reasoning = answer.locator("details.reasoning")
    assert reasoning.locator("summary").inner_text() == "Reasoning"
    shown = reasoning.locator("div").evaluate("e => e.textContent")
    assert shown == msg["reasoning_content"]
    text = answer.locator(".content").evaluate("e => e.textContent")
    assert "</think>" not in text and msg["reasoning_content"].strip() not in text
