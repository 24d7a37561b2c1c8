"""Issue 31 item 13, the parts no other test covered: the web UI offers "Load adapter" only
where the server can load one (`/props` says `lora_loading`, the page hides the form on it,
and the load route answers 501 without `--lora-dir`), and the README's first lines lead a
newcomer to completion and the demo adapters, not to chat on a base model, with no promise
of memory "close to the file size"."""

from __future__ import annotations

import re
from pathlib import Path

from tests.server_util import peft_folder, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]


def test_load_adapter_is_offered_only_with_a_lora_dir(tmp_path: Path) -> None:
    with serve_in_thread(["-c", "256"]) as s:
        assert s.client.get("/props").json()["lora_loading"] is False
        r = s.client.post("/lora-adapters/load", json={"path": "up"})
        assert r.status_code == 501, r.text
        assert "--lora-dir" in r.json()["error"]["message"]
    peft_folder(tmp_path / "up", 1)
    with serve_in_thread(["-c", "256", "--lora-dir", str(tmp_path)]) as s:
        assert s.client.get("/props").json()["lora_loading"] is True
        r = s.client.post("/lora-adapters/load", json={"path": "up"})
        assert r.status_code == 200, r.text
    # the page hides the form on exactly that field (the browser tests run the page itself)
    main_js = (ROOT / "loraserve/server/webui/main.js").read_text()
    assert re.search(r'\$\("load-form"\)\.hidden\s*=\s*props\.lora_loading\s*===\s*false', main_js)


def test_readme_starts_with_completion_and_the_demo_adapters() -> None:
    text = (ROOT / "README.md").read_text()
    first = text.split("\n## ", 1)[0]  # the part before the first section
    assert "base" in first and "Completion mode" in first
    calls = re.findall(r"curl -s localhost:8080(/\S+)", first)
    assert calls and all(c == "/completion" for c in calls), calls
    assert '"lora"' in first and "uppercase" in first  # a demo adapter, switched on
    assert "close to the file size" not in text
