"""Helpers for the browser tests: Debian's chromium driven by playwright (never a browser
download), and a page wrapper that records the JSON bodies the UI sends."""

from __future__ import annotations

import os
import shutil
from types import ModuleType
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 30_000


def require_browser() -> ModuleType:
    """playwright's sync API; skips the calling test module when it or chromium is missing."""
    try:
        from playwright import sync_api
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright)", allow_module_level=True)
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
    sync_api.expect.set_options(timeout=TIMEOUT_MS)
    return sync_api


class Page:
    """A fresh browser context on the UI, recording the API requests' JSON bodies."""

    def __init__(self, browser: Any, url: str, width: int = 1280, height: int = 800) -> None:
        self.ctx = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.sent: list[tuple[str, Any]] = []
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", self._record)
        self.url = url

    def _record(self, req: Any) -> None:
        if req.method == "POST":
            self.sent.append((req.url.removeprefix(self.url), req.post_data_json))

    def open(self, mode: str | None = None) -> Any:
        """Load the page, wait until it is ready, switch to `mode` (a mode button's name)."""
        self.page.goto(self.url + "/")
        self.page.wait_for_selector("body[data-ready=true]")
        if mode:
            self.page.get_by_role("button", name=mode, exact=True).click()
        return self.page

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies POSTed to `path`, in order."""
        return [body for p, body in self.sent if p == path]

    def complete(self, prompt: str) -> str:
        """Run a raw completion; the info line under the answer once it is done."""
        pg = self.page
        pg.get_by_label("Prompt (raw text").fill(prompt)
        pg.get_by_role("button", name="Complete").click()
        pg.wait_for_selector("#completion-answer:not(:has([aria-busy])) #completion-info .info-mix")
        return pg.inner_text("#completion-info")

    def generated(self) -> str:
        """The text the last completion generated (after the prompt)."""
        return self.page.inner_text("#completion-output .generated")

    def close(self) -> None:
        """Close the context; no uncaught page error may have happened."""
        self.ctx.close()
        assert not self.errors, self.errors
