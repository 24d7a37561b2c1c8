"""Remembered content ids (`lora.content_ids`): a re-read of an unchanged adapter file
skips hashing and gets the same id; a file whose values changed gets the id of its new
values (a fresh registry's, which hashes them), even at the same size with its
modification time put back, written during the read, or written just before it."""

from __future__ import annotations

import os
import time

import pytest

import loraserve.lora.adapter as adapter_mod
from loraserve.lora import content_ids
from loraserve.lora.registry import AdapterRegistry
from tests.unit.lora.lora_util import gguf_adapter, pairs


@pytest.fixture
def hashes(monkeypatch) -> list[str]:
    """The content ids hashed (each call of `adapter._content_id`)."""
    out: list[str] = []
    real = adapter_mod._content_id

    def counted(held, arena):  # type: ignore[no-untyped-def]
        out.append(real(held, arena))
        return out[-1]

    monkeypatch.setattr(adapter_mod, "_content_id", counted)
    return out


def _settled(monkeypatch) -> None:
    """Files older than 50 ms count as settled (the default margin is 2 s)."""
    monkeypatch.setattr(content_ids, "MARGIN_NS", 50_000_000)
    time.sleep(0.1)


def _fresh_id(model, path) -> str:  # type: ignore[no-untyped-def]
    """The oracle: the id a registry that never read the file hashes."""
    return AdapterRegistry(model).read_path(path).content_id


def test_unchanged_file_is_not_hashed_again(llama, tmp_path, monkeypatch, hashes) -> None:
    _, model = llama
    path = gguf_adapter(tmp_path / "a.gguf", "llama", pairs(1))
    _settled(monkeypatch)
    reg = AdapterRegistry(model)
    a = reg.load(path)
    assert len(hashes) == 1 and len(reg.content_ids) == 1
    targets = set(a.weights)
    reg.evict(a.id)
    again = reg.read(a.id)
    assert again.content_id == a.content_id and len(hashes) == 1 and reg.content_ids.hits == 1
    assert set(again.weights) == targets


def test_same_size_and_restored_mtime_still_rehashed(
    llama,
    tmp_path,
    monkeypatch,
    hashes,
) -> None:
    _, model = llama
    path = gguf_adapter(tmp_path / "a.gguf", "llama", pairs(1))
    _settled(monkeypatch)
    reg = AdapterRegistry(model)
    first = reg.read_path(path)
    st = os.stat(path)
    gguf_adapter(path, "llama", pairs(2))  # other values, the same size, written in place
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    second = reg.read_path(path)
    assert second.content_id != first.content_id
    assert second.content_id == _fresh_id(model, path)
    assert reg.content_ids.hits == 0


def test_file_written_just_before_the_read_is_not_remembered(llama, tmp_path, hashes) -> None:
    _, model = llama
    path = gguf_adapter(tmp_path / "a.gguf", "llama", pairs(1))  # within the 2 s margin
    reg = AdapterRegistry(model)
    ids = {reg.read_path(path).content_id for _ in range(2)}
    assert len(ids) == 1 and len(hashes) == 2 and len(reg.content_ids) == 0


def test_write_between_lookup_and_read_gets_the_new_id(
    llama,
    tmp_path,
    monkeypatch,
    hashes,
) -> None:
    _, model = llama
    path = gguf_adapter(tmp_path / "a.gguf", "llama", pairs(1))
    _settled(monkeypatch)
    reg = AdapterRegistry(model)
    old = reg.read_path(path).content_id
    real = content_ids.ContentIds.before_read

    def then_write(self, p):  # type: ignore[no-untyped-def]
        seen = real(self, p)  # the old file's identity and its remembered id
        gguf_adapter(path, "llama", pairs(3))
        return seen

    monkeypatch.setattr(content_ids.ContentIds, "before_read", then_write)
    got = reg.read_path(path)
    assert seen_known(reg, old)
    assert got.content_id != old
    monkeypatch.setattr(content_ids.ContentIds, "before_read", real)
    assert got.content_id == _fresh_id(model, path)


def seen_known(reg: AdapterRegistry, cid: str) -> bool:
    """Whether ``cid`` is among the remembered ids (the lookup did find one)."""
    return cid in reg.content_ids._ids.values()
