"""Fixtures of the browser tests: one headless chromium per test module, and a fresh page on
the module's own server (`srv`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.server_util import Served
from tests.webui_util import CHROMIUM, CHROMIUM_ARGS, Page, require_browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium per test module."""
    sync_api = require_browser()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def ui(browser: Any, srv: Served) -> Iterator[Page]:
    """A fresh browser context on the module's server."""
    p = Page(browser, srv.url)
    yield p
    p.close()
