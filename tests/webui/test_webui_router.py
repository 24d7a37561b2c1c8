"""The web UI on a router (`loraserve` without `-m`): a model picker lists every model with
its status; the chosen one is named in every call (POST bodies' `model`, GET `?model=`), and
choosing another reloads the page on it, loading that model on first use."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.http.router_util import router
from tests.server_util import tiny_model_path
from tests.tiny import hf_model, write_gguf
from tests.webui_util import Page, require_browser

require_browser()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("models")
    shutil.copy(tiny_model_path(), d / "tiny.gguf")
    write_gguf(d / "other.gguf", hf_model("llama", seed=11), "llama")
    with router(["--models-dir", str(d), "-c", "256", "-np", "1"]) as (c, _):
        yield str(c.base_url).rstrip("/")


def test_model_picker_routes_every_call(browser: Any, url: str) -> None:
    from playwright.sync_api import expect

    ui = Page(browser, url)
    pg = ui.open()
    picker = pg.locator("#model-picker")
    expect(picker).to_be_visible()
    options = [o.split(" (")[0] for o in picker.locator("option").all_inner_texts()]
    assert {"tiny", "other"} <= set(options)
    for name in ("tiny", "other"):
        pg.locator("#model-picker").select_option(name)  # the page reloads on it
        pg.wait_for_selector("body[data-ready=true]")
        expect(pg.locator("#model-picker")).to_have_value(name)
        expect(pg.locator("#model-info")).to_contain_text(name)
        pg.get_by_role("button", name="Completion", exact=True).click()
        ui.complete("hello")
        assert ui.bodies("/completion")[-1]["model"] == name
        assert ui.generated()
    ui.close()
