"""The suite's stand-in hub (scripts/llama_suite_hub.py) holding a tiny model under two tags and a
preset repository, with an empty download cache (the `hub` fixture), and a router's
`/models/sse` events collected in a thread."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_util import tiny_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from llama_suite_hub import serve  # noqa: E402

PRESETS = "[p1]\nhf-repo = org/dl:F16\nctx-size = 256\n\n[p2]\nhf-repo = org/dl:Q8_0\n"


@pytest.fixture()
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """A hub holding `org/dl` (two tags of the tiny model) and `org/presets` (a preset.ini),
    an empty download cache, and the model's bytes."""
    model = tiny_model_path()
    repos: dict[str, dict[str, bytes | Path]] = {
        "org/dl": {"dl-F16.gguf": model, "q8/dl-Q8_0.gguf": model, "README.md": b"hi"},
        "org/presets": {"preset.ini": PRESETS.encode()},
    }
    server, url = serve(repos)
    monkeypatch.setenv("MODEL_ENDPOINT", url)
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "cache"))
    try:
        yield {"cache": tmp_path / "cache", "model": model, "url": url}
    finally:
        server.shutdown()


class Events:
    """`/models/sse` collected in a thread (subscribed before it returns)."""

    def __init__(self, c: httpx.Client) -> None:
        self.items: list[dict] = []
        ready = threading.Event()

        def listen() -> None:
            try:
                with c.stream("GET", "/models/sse", timeout=60) as r:
                    for line in r.iter_lines():
                        ready.set()  # the first line is the subscription comment
                        if line.startswith("data: "):
                            self.items.append(json.loads(line[6:]))
            except httpx.HTTPError:  # the client closed at the test's end
                pass

        threading.Thread(target=listen, daemon=True).start()
        assert ready.wait(10)

    def wait(self, event: str, model: str) -> list[dict]:
        deadline = time.monotonic() + 60
        while not any(e["event"] == event and e["model"] == model for e in self.items):
            assert time.monotonic() < deadline, self.items
            time.sleep(0.02)
        return [e for e in self.items if e["model"] == model]


def ids(c: httpx.Client) -> dict[str, dict]:
    """The router's `/models` entries by id."""
    return {m["id"]: m for m in c.get("/models").json()["data"]}
