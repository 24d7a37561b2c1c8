"""The web UI on the real model (Gemma 3 270M) with the demo adapters: the uppercase
slider changes the answer, and compare mode shows the three styles side by side.

`LORASERVE_SCREENSHOTS=DIR` writes the README's screenshots (desktop and phone) there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loraserve.adapters import gguf_path, is_titlecase, is_uppercase, uppercase_fraction
from loraserve.model.loader import load_model
from tests.server_util import Served, serve_in_thread
from tests.webui_util import Page, require_browser

pytestmark = pytest.mark.real_model
expect = require_browser().expect
PROMPT = "Question: Why do cats purr?\nAnswer:"


@pytest.fixture(scope="module")
def srv(real_model_path: Path) -> Iterator[Served]:
    args = ["-m", str(real_model_path), "-np", "3", "-c", "3072", "--temp", "0", "-n", "32"]
    for name in ("uppercase", "titlecase"):
        args += ["--lora-scaled", f"{gguf_path(name)}:0"]
    with serve_in_thread(args, model=load_model(real_model_path)) as s:
        yield s


def set_scale(pg: Any, label: str, value: str) -> None:
    box = pg.get_by_label(label)
    box.fill(value)
    box.press("Tab")


def test_uppercase_slider_changes_the_answer(browser: Any, srv: Served) -> None:
    ui = Page(browser, srv.url)
    pg = ui.open("Completion")
    ui.complete(PROMPT)
    base = ui.generated()
    assert uppercase_fraction(base) < 0.5, base
    set_scale(pg, "uppercase scale", "1")
    assert pg.get_by_role("slider", name="uppercase").input_value() == "1"
    info = ui.complete(PROMPT)
    assert ui.bodies("/completion")[-1]["lora"] == [
        {"id": 0, "scale": 1},
        {"id": 1, "scale": 0},
    ]
    assert is_uppercase(ui.generated()), ui.generated()
    assert "mix: uppercase 1.00" in info.lower()
    ui.close()


def test_stop_ends_the_stream_early(browser: Any, srv: Served) -> None:
    """Esc (or the Stop button) aborts the chat answer being streamed; the text so far stays."""
    ui = Page(browser, srv.url)
    pg = ui.open("Chat")
    box = pg.get_by_label("Message", exact=True)
    box.fill("Tell me a long story about a cat.")
    box.press("Enter")
    expect(pg.locator("li.msg.assistant .content")).not_to_be_empty()
    expect(pg.get_by_role("button", name="Stop")).to_be_enabled()
    pg.keyboard.press("Escape")
    expect(pg.locator("li.msg.assistant .info-stop")).to_have_text("stopped")
    assert pg.locator("li.msg.assistant .content").inner_text()
    expect(pg.get_by_role("button", name="Send")).to_be_enabled()
    ui.close()


@pytest.mark.parametrize(("width", "height", "name"), [(1280, 860, "desktop"), (390, 844, "phone")])
def test_compare_three_styles(
    browser: Any, srv: Served, width: int, height: int, name: str
) -> None:
    ui = Page(browser, srv.url, width, height)
    pg = ui.open("Compare")
    pg.get_by_label("Prompt, answered").fill(PROMPT)
    pg.get_by_role("button", name="Add mix").click()
    set_scale(pg, "Mix 2 uppercase", "1")
    set_scale(pg, "Mix 3 titlecase", "1")
    pg.get_by_role("button", name="Run all").click()
    expect(pg.locator("#compare-summary")).to_contain_text("mixes")
    expect(pg.locator("#compare-run")).to_be_enabled()
    outs = pg.locator("#compare-columns .column .output").all_inner_texts()
    assert uppercase_fraction(outs[0]) < 0.5 and is_uppercase(outs[1]), outs
    assert is_titlecase(outs[2]), outs
    assert "in parallel" in pg.inner_text("#compare-summary")
    assert pg.evaluate("document.documentElement.scrollWidth") <= width
    out = os.environ.get("LORASERVE_SCREENSHOTS")
    if out:
        pg.screenshot(path=str(Path(out) / f"webui-{name}.png"), full_page=True)
    ui.close()
