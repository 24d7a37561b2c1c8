"""`/slots` under `--cache-isolation key` (issue 31 item 6): a slot's token count, task and
saved files belong to the API key whose sequence it holds. Another key sees the slot as one
that has run nothing, cannot save or erase it (the answer carries its token count), and
cannot restore, overwrite or even find that key's slot files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http.tenant_util import KEYS, SECRET, action, auth, slots, used_slot
from tests.server_util import Served, serve_in_thread


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("slots")
    args = ["-np", "2", "-c", "512", "--cache-isolation", "key", "--slot-save-path", str(folder)]
    with serve_in_thread([*args, "--api-key", KEYS[0], "--api-key", KEYS[1]]) as s:
        yield s


def test_slots_hide_another_keys_token_counts(keyed: Served) -> None:
    body = {"prompt": SECRET, "n_predict": 3, "temperature": 0}
    r = keyed.client.post("/completion", json=body, headers=auth(KEYS[0]))
    assert r.status_code == 200, r.text
    slot = used_slot(keyed, KEYS[0])
    theirs = slots(keyed, KEYS[1])
    assert [s["n_tokens"] for s in theirs] == [0, 0]  # the prompt's length is not shown
    assert all("id_task" not in s for s in theirs)
    # the other key can neither save nor erase it (the answers carry its token count)
    for what, name in (("save", "stolen.bin"), ("erase", "")):
        r = action(keyed, KEYS[1], slot, what, name)
        assert r.status_code == 400 and "another API key" in r.text, r.text
    assert slots(keyed, KEYS[0])[slot]["n_tokens"] > 0  # still there


def test_slot_files_belong_to_their_key(keyed: Served, tmp_path: Path) -> None:
    body = {"prompt": SECRET + " again", "n_predict": 2, "temperature": 0}
    keyed.client.post("/completion", json=body, headers=auth(KEYS[0]))
    slot = used_slot(keyed, KEYS[0])
    saved = action(keyed, KEYS[0], slot, "save", "mine.bin")
    assert saved.status_code == 200, saved.text
    n = saved.json()["n_saved"]
    assert n > 0
    other = 1 - slot
    # another key: the file is not there for it, and its name is not its to replace
    r = action(keyed, KEYS[1], other, "restore", "mine.bin")
    assert r.status_code == 404, r.text
    r = action(keyed, KEYS[1], other, "save", "mine.bin")
    assert r.status_code == 400 and "another API key" in r.text, r.text
    # its owner restores it into the other slot: that slot is now the owner's alone
    r = action(keyed, KEYS[0], other, "restore", "mine.bin")
    assert r.status_code == 200 and r.json()["n_restored"] == n, r.text
    assert slots(keyed, KEYS[0])[other]["n_tokens"] == n
    assert slots(keyed, KEYS[1])[other]["n_tokens"] == 0
    assert action(keyed, KEYS[1], other, "erase").status_code == 400
    r = action(keyed, KEYS[0], other, "erase")
    assert r.status_code == 200 and r.json()["n_erased"] == n
    # an empty slot is anyone's
    r = action(keyed, KEYS[1], other, "save", "theirs.bin")
    assert r.status_code == 200 and r.json()["n_saved"] == 0, r.text
