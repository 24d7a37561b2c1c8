"""Slot save/restore/erase (the cache key travels with the KV) and /metrics counters."""

from __future__ import annotations

import hashlib
import json

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from tests.server_util import scrape_metrics, serve_in_thread

PROMPT = "the of and to in is it that was for on are as with his they"
N_PREDICT = 4


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def srv(slot_dir):
    args = ["-np", "1", "-c", "256", "--temp", "0", "--cache-ram", "0", "--metrics"]
    with serve_in_thread([*args, "--slot-save-path", str(slot_dir)]) as s:
        yield s


def complete(srv, **kw) -> dict:
    body = {"prompt": PROMPT, "n_predict": N_PREDICT, "ignore_eos": True, **kw}
    r = srv.client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def action(srv, name: str, filename: str | None = None, status: int = 200) -> dict:
    body = {"filename": filename} if filename else None
    r = srv.client.post(f"/slots/0?action={name}", json=body)
    assert r.status_code == status, r.text
    return r.json()


def test_save_erase_restore(srv, slot_dir) -> None:
    ref = complete(srv, cache_prompt=False)
    n = ref["tokens_evaluated"]
    held = n + N_PREDICT - 1  # the last generated token's KV is never computed
    saved = action(srv, "save", "a.bin")
    assert saved["n_saved"] == held and saved["id_slot"] == 0
    assert saved["n_written"] == (slot_dir / "a.bin").stat().st_size
    assert action(srv, "erase")["n_erased"] == held
    after_erase = complete(srv)
    assert after_erase["timings"]["cache_n"] == 0 and after_erase["content"] == ref["content"]
    action(srv, "erase")
    restored = action(srv, "restore", "a.bin")
    assert restored["n_restored"] == held and restored["n_read"] > 0
    assert srv.client.get("/slots").json()[0]["n_tokens"] == held
    warm = complete(srv)
    assert warm["timings"]["cache_n"] == n - 1 and warm["timings"]["prompt_n"] == 1
    assert warm["content"] == ref["content"]


def test_restore_under_another_cache_key_is_not_reused(srv, slot_dir) -> None:
    ref = complete(srv, cache_prompt=False)
    action(srv, "save", "base.bin")
    with safe_open(str(slot_dir / "base.bin"), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert json.loads(meta["cache_key"]) == []
    meta["cache_key"] = json.dumps([["some-adapter-content", 1.0]])
    save_file(tensors, str(slot_dir / "other.bin"), metadata=meta)
    action(srv, "erase")
    assert action(srv, "restore", "other.bin")["n_restored"] == len(tensors["tokens"])
    res = complete(srv)
    assert res["timings"]["cache_n"] == 0 and res["content"] == ref["content"]


def test_foreign_slot_files_are_refused(srv, slot_dir) -> None:
    (slot_dir / "junk.bin").write_bytes(b"\x00" * 64)
    assert "slot file" in action(srv, "restore", "junk.bin", 400)["error"]["message"]
    action(srv, "save", "mine.bin")
    with safe_open(str(slot_dir / "mine.bin"), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    fp = json.loads(meta["fingerprint"])
    meta["fingerprint"] = json.dumps({**fp, "n_layers": 99}, sort_keys=True)
    save_file(tensors, str(slot_dir / "alien.bin"), metadata=meta)
    err = action(srv, "restore", "alien.bin", 400)["error"]
    assert err["type"] == "invalid_request_error" and "another model" in err["message"]
    (slot_dir / "escape.bin").symlink_to("/etc/hostname")
    assert action(srv, "restore", "escape.bin", 404)["error"]["type"] == "not_found_error"
    assert complete(srv)["tokens_predicted"] == N_PREDICT


def test_metrics_counters_move(srv) -> None:
    r = srv.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    before = scrape_metrics(srv)
    for name in (
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:kv_cache_usage_ratio",
        "loraserve:cache_hits_total",
        "loraserve:cache_misses_total",
        "loraserve:cache_evictions_total",
        "loraserve:kv_blocks_used",
    ):
        assert name in before, name
    first = complete(srv, prompt="in the", cache_prompt=True)
    complete(srv, prompt="in the")
    action(srv, "erase")
    after = scrape_metrics(srv)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["llamacpp:tokens_predicted_total"] == 2 * N_PREDICT
    assert delta["loraserve:requests_finished_total"] == 2
    assert delta["llamacpp:prompt_tokens_total"] >= first["timings"]["prompt_n"] + 1
    assert delta["loraserve:cache_hits_total"] >= 1
    assert delta["loraserve:cache_evictions_total"] >= 1  # --cache-ram 0: erased blocks go
    assert after["llamacpp:requests_processing"] == 0


def test_save_never_replaces_a_file_that_is_not_a_slot(srv, slot_dir) -> None:
    """Issue 31: `{"filename": "notes.txt"}` over the operator's file is a 400 naming it;
    the file stays byte for byte. A slot file of ours is replaced as before."""
    notes = slot_dir / "notes.txt"
    notes.write_bytes(b"the operator's notes\n")
    complete(srv, cache_prompt=False)
    err = action(srv, "save", "notes.txt", 400)["error"]
    assert err["type"] == "invalid_request_error" and "notes.txt" in err["message"]
    assert notes.read_bytes() == b"the operator's notes\n"
    first = action(srv, "save", "twice.bin")["n_written"]
    assert action(srv, "save", "twice.bin")["n_written"] == first


def test_slot_from_other_weights_does_not_restore(srv, slot_dir) -> None:
    """The slot file records the SHA-256 of the weights (checked against hashlib over the
    served file); a file whose hash differs (same name and shapes) is a 400 naming it."""
    complete(srv, cache_prompt=False)
    action(srv, "save", "w.bin")
    with safe_open(str(slot_dir / "w.bin"), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    fp = json.loads(meta["fingerprint"])
    model_path = srv.app.state.server.model.path
    assert fp["weights_sha256"] == hashlib.sha256(model_path.read_bytes()).hexdigest()
    meta["fingerprint"] = json.dumps({**fp, "weights_sha256": "0" * 64}, sort_keys=True)
    save_file(tensors, str(slot_dir / "other-weights.bin"), metadata=meta)
    err = action(srv, "restore", "other-weights.bin", 400)["error"]
    assert "another model" in err["message"] and "weights_sha256" in err["message"]
    assert action(srv, "restore", "w.bin")["n_restored"] == len(tensors["tokens"])
