"""The web UI over HTTP: `/` serves the page, static files carry their content types,
`--no-webui` answers 404, the page stays public under `--api-key` while the API does not,
and nothing in the page reaches outside this server."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from loraserve.chat.template import CHATML_TEMPLATE
from loraserve.server.webui import CONTENT_TYPES, WEBUI_DIR, static_files
from tests.server_util import Served, serve_in_thread

FILES = sorted(static_files())


@pytest.fixture(scope="module")
def srv() -> Iterator[Served]:
    with serve_in_thread(["-np", "1", "-c", "256"]) as s:
        yield s


def test_root_serves_the_page(srv: Served) -> None:
    for path in ("/", "/index.html"):
        r = srv.client.get(path)
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert '<script type="module" src="/webui/main.js"></script>' in r.text
        assert "default-src 'self'" in r.headers["content-security-policy"]


@pytest.mark.parametrize("name", FILES)
def test_static_files_have_their_content_types(srv: Served, name: str) -> None:
    r = srv.client.get(f"/webui/{name}")
    assert r.status_code == 200
    suffix = "." + name.rsplit(".", 1)[1]
    assert r.headers["content-type"] == CONTENT_TYPES[suffix]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.content == (WEBUI_DIR / name).read_bytes()


@pytest.mark.parametrize(
    "path", ["/webui/missing.js", "/webui/..%2Fwebui.py", "/webui/../webui.py", "/webui/"]
)
def test_anything_else_under_webui_is_404(srv: Served, path: str) -> None:
    assert srv.client.get(path).status_code == 404


def test_no_webui_gives_404_and_leaves_the_api() -> None:
    with serve_in_thread(["-np", "1", "-c", "256", "--no-webui"]) as s:
        for path in ("/", "/index.html", "/webui/main.js"):
            r = s.client.get(path)
            assert r.status_code == 404
            assert r.json()["error"]["type"] == "not_found_error"
        assert s.client.get("/health").status_code == 200


def test_page_is_public_under_api_key_but_the_api_is_not() -> None:
    with serve_in_thread(["-np", "1", "-c", "256", "--api-key", "k1"]) as s:
        assert s.client.get("/").status_code == 200
        assert s.client.get("/webui/main.js").status_code == 200
        assert s.client.get("/props").status_code == 401
        assert s.client.get("/lora-adapters").status_code == 401
        assert s.client.get("/props", headers={"Authorization": "Bearer k1"}).status_code == 200


URL = re.compile(r"""(?:https?:)?//[\w.-]+\.\w""")
ATTR = re.compile(r"""(?:src|href|action)\s*=\s*["']([^"']*)["']""")
IMPORT = re.compile(r"""^import\b[^"']*["']([^"']+)["']""", re.M)


@pytest.mark.parametrize("name", FILES)
def test_the_page_makes_no_external_requests(name: str) -> None:
    text = (WEBUI_DIR / name).read_text()
    assert not re.findall(r"https?://", text), f"{name} names an absolute URL"
    assert not URL.findall(text), f"{name} names a protocol-relative URL"
    for ref in ATTR.findall(text):
        assert ref.startswith(("/webui/", "data:")), f"{name}: {ref}"
    for ref in IMPORT.findall(text):
        assert ref.startswith("./") and (WEBUI_DIR / ref[2:]).is_file(), f"{name}: {ref}"
    assert "@import" not in text and "url(" not in text.replace("data:", "")


@pytest.mark.parametrize("name", [n for n in FILES if n.endswith(".js")])
def test_model_text_never_reaches_html_parsing(name: str) -> None:
    text = (WEBUI_DIR / name).read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in text, f"{name} uses {sink}"
    assert len(text.splitlines()) < 300


def test_page_knows_the_chatml_fallback() -> None:
    """The page tells "no chat template" from /props by the fallback's exact text."""
    line = next(
        x for x in (WEBUI_DIR / "template.js").read_text().splitlines() if "CHATML_FALLBACK =" in x
    )
    assert json.loads(line.split("=", 1)[1].strip().rstrip(";")) == CHATML_TEMPLATE
