"""`/slots` under `--cache-isolation key`, the rest of issue 31 item 6: another key does not
even see that a slot is processing; a restore that a request races is still credited to the
key that restored (the request ran before the restore, so the slot holds the restorer's
sequence); slot files saved without the flag, or with it on a server without it, are a 400
saying so (they were a 404 "no slot file", or "saved from another model")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest

from loraserve.engine import slot_io
from tests.http.tenant_util import KEYS, SECRET, action, auth, slots, used_slot
from tests.server_util import Served, serve_in_thread


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def keyed(folder: Path) -> Iterator[Served]:
    args = ["-np", "2", "-c", "1024", "--cache-isolation", "key", "--slot-save-path", str(folder)]
    with serve_in_thread([*args, "--api-key", KEYS[0], "--api-key", KEYS[1]]) as s:
        yield s


def engine(srv: Served) -> Any:
    return srv.app.state.server.engine


def test_another_key_does_not_see_a_slot_processing(keyed: Served) -> None:
    body = {"prompt": SECRET, "n_predict": 400, "temperature": 0, "stream": True}
    seen = 0
    with keyed.client.stream("POST", "/completion", json=body, headers=auth(KEYS[0])) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            theirs, mine = slots(keyed, KEYS[1]), slots(keyed, KEYS[0])
            assert not any(s["is_processing"] for s in theirs), theirs
            seen += any(s["is_processing"] for s in mine)
            if i >= 20:
                break
    assert seen  # the owner saw its slot processing while the other key looked


def test_a_restore_raced_by_a_request_stays_the_restorers(keyed: Served, monkeypatch) -> None:
    body = {"prompt": SECRET + " once more", "n_predict": 2, "temperature": 0}
    assert keyed.client.post("/completion", json=body, headers=auth(KEYS[0])).status_code == 200
    slot = used_slot(keyed, KEYS[0])
    saved = action(keyed, KEYS[0], slot, "save", "raced.bin")
    assert saved.status_code == 200, saved.text
    n = saved.json()["n_saved"]
    target = 1 - slot
    eng = engine(keyed)
    real = eng.restore_slot

    def racing(slot_id: int, image: slot_io.SlotImage, *a: Any) -> Future[int]:
        """The other key's request runs in the slot after the restore was asked for and
        before it happens (the engine thread takes them in that order)."""
        out: Future[int] = Future()

        def run() -> None:
            try:
                other = {"prompt": "a b c d", "n_predict": 2, "id_slot": slot_id}
                r = httpx.post(f"{keyed.url}/completion", json=other, headers=auth(KEYS[1]))
                assert r.status_code == 200, r.text
                out.set_result(real(slot_id, image, *a).result())
            except BaseException as e:  # re-raised by the handler awaiting `out`
                out.set_exception(e)

        threading.Thread(target=run).start()
        return out

    monkeypatch.setattr(eng, "restore_slot", racing)
    r = action(keyed, KEYS[0], target, "restore", "raced.bin")
    assert r.status_code == 200 and r.json()["n_restored"] == n, r.text
    monkeypatch.setattr(eng, "restore_slot", real)
    # the slot holds the restorer's sequence: its token count is the restorer's to see
    assert slots(keyed, KEYS[0])[target]["n_tokens"] == n
    assert slots(keyed, KEYS[1])[target]["n_tokens"] == 0
    r = action(keyed, KEYS[1], target, "save", "stolen.bin")
    assert r.status_code == 400 and "another API key" in r.text, r.text
    assert action(keyed, KEYS[0], target, "erase").status_code == 200


def test_a_slot_file_saved_without_isolation_is_a_clear_error(keyed: Served, folder: Path) -> None:
    eng = engine(keyed)
    assert (
        keyed.client.post(
            "/completion", json={"prompt": SECRET, "n_predict": 2}, headers=auth(KEYS[0])
        ).status_code
        == 200
    )
    slot = used_slot(keyed, KEYS[0])
    image = eng.save_slot(slot).result()
    slot_io.write(folder / "legacy.bin", image, eng.slot_fingerprint(), -1)  # no owner
    for key in KEYS:
        r = action(keyed, key, 1 - slot, "restore", "legacy.bin")
        assert r.status_code == 400, r.text
        assert "saved without --cache-isolation key" in r.json()["error"]["message"]
    r = action(keyed, KEYS[0], slot, "save", "legacy.bin")  # nor replaced by a key
    assert r.status_code == 400 and "saved without --cache-isolation key" in r.text, r.text
    assert (folder / "legacy.bin").stat().st_size > 0


def test_a_keyed_slot_file_on_a_server_without_isolation_is_a_clear_error(
    tmp_path: Path,
) -> None:
    with serve_in_thread(["-np", "1", "-c", "512", "--slot-save-path", str(tmp_path)]) as srv:
        assert srv.client.post("/completion", json={"prompt": SECRET, "n_predict": 2}).is_success
        eng = engine(srv)
        image = eng.save_slot(0).result()
        fp = {**eng.slot_fingerprint(), "owner": "key:0123abcd"}
        slot_io.write(tmp_path / "keyed.bin", image, fp, -1)
        r = srv.client.post("/slots/0?action=restore", json={"filename": "keyed.bin"})
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]
        assert "saved under --cache-isolation key" in msg and "0123abcd" not in msg
