"""Content ids without the blake3 package: `lora.adapter` falls back to hashlib's sha256
(another id for the same file, the same guarantees). In this process the fallback is put in
place of BLAKE3 (`_hasher`); a subprocess that cannot import blake3 shows that this is the
hasher the module picks then, with the same ids.

The oracles: hashlib.sha256 over the id's documented layout, computed here from the held
tensors; a registry that never read the file (a fresh hash); and the engine's answers with
the prefix cache off. Under sha256, ids stay equal for equal content within a process (a
re-read, a copy, a remembered id after an eviction), differ for any changed value or storage
type, and the prefix cache never serves one content's KV to another.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

import loraserve.lora.adapter as adapter_mod
from loraserve.engine.engine import Engine, EngineConfig
from loraserve.lora import content_ids
from loraserve.lora.registry import AdapterRegistry
from tests.engine_util import ask, run_and_drain, tokens
from tests.unit.lora.lora_util import Tiny, gguf_adapter, reference_content_id, tiny

REPO = Path(__file__).resolve().parents[3]
PROMPT = [1, 5, 77, 30, 12, 9, 26, 61, 20, 15, 33, 7, 41, 42, 43]
SHAPES = {"blk.0.attn_v.weight": ((4, 64), (32, 4)), "blk.1.ffn_up.weight": ((4, 64), (96, 4))}


@pytest.fixture(scope="module")
def llama_sha(tmp_path_factory) -> Tiny:
    """The tiny transformers llama (hidden 64, ffn 96) and its GGUF loaded."""
    return tiny(tmp_path_factory, "llama")


@pytest.fixture
def sha256(monkeypatch) -> None:
    """Content ids hashed as an install without blake3 hashes them."""
    monkeypatch.setattr(adapter_mod, "_hasher", hashlib.sha256)


def _pairs(seed: int, magnitude: float = 0.1) -> dict[str, torch.Tensor]:
    """GGUF LoRA tensors on the tiny llama's v and ffn_up, values float16 holds exactly."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (sa, sb) in SHAPES.items():
        out[name + ".lora_a"] = (torch.randn(sa, generator=g) * magnitude).half().float()
        out[name + ".lora_b"] = (torch.randn(sb, generator=g) * magnitude).half().float()
    return out


def _f16(t: dict[str, torch.Tensor]) -> dict[str, Q]:
    return dict.fromkeys(t, Q.F16)


def test_ids_are_sha256_of_the_stored_values(llama_sha, tmp_path, sha256) -> None:
    _, model = llama_sha
    reg = AdapterRegistry(model)
    t = _pairs(1)
    f16 = reg.read_path(gguf_adapter(tmp_path / "h.gguf", "llama", t, types=_f16(t)))
    f32 = reg.read_path(gguf_adapter(tmp_path / "w.gguf", "llama", t))
    assert all(w.a16 is not None for w in f16.weights.values())  # the halves path
    assert all(w.a16 is None for w in f32.weights.values())  # the float32 path
    for a in (f16, f32):
        assert a.content_id == reference_content_id(a, hashlib.sha256())
    assert f16.content_id != f32.content_id  # the same values stored two ways: kept apart


def test_equal_content_equal_ids_and_any_change_a_new_one(llama_sha, tmp_path, sha256) -> None:
    _, model = llama_sha
    reg = AdapterRegistry(model)
    t = _pairs(2)
    path = gguf_adapter(tmp_path / "a.gguf", "llama", t, types=_f16(t))
    copy = shutil.copy(path, tmp_path / "copy.gguf")
    ids = [reg.read_path(p).content_id for p in (path, path, copy)]
    ids.append(AdapterRegistry(model).read_path(path).content_id)  # another registry
    assert len(set(ids)) == 1
    bumped = dict(t)
    key = "blk.1.ffn_up.weight.lora_b"
    b = t[key].numpy().astype(np.float16)
    b.flat[-1] = np.nextafter(b.flat[-1], np.float16(np.inf))  # one ulp on one value
    bumped[key] = torch.from_numpy(b.astype(np.float32))
    other = gguf_adapter(tmp_path / "b.gguf", "llama", bumped, types=_f16(bumped))
    scaled = gguf_adapter(tmp_path / "c.gguf", "llama", t, alpha=16.0, types=_f16(t))
    new = {reg.read_path(p).content_id for p in (other, scaled)}
    assert len(new) == 2 and ids[0] not in new


def test_remembered_ids_after_eviction_are_the_hash(llama_sha, tmp_path, monkeypatch, sha256):
    _, model = llama_sha
    path = gguf_adapter(tmp_path / "a.gguf", "llama", _pairs(3))
    monkeypatch.setattr(content_ids, "MARGIN_NS", 50_000_000)  # settled after 50 ms
    time.sleep(0.1)
    reg = AdapterRegistry(model)
    a = reg.load(path)
    reg.evict(a.id)
    again = reg.read(a.id)
    assert reg.content_ids.hits == 1  # not hashed again: the remembered id
    assert again.content_id == a.content_id == AdapterRegistry(model).read_path(path).content_id
    st = os.stat(path)
    gguf_adapter(path, "llama", _pairs(4))  # other values, the same size, in place
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = reg.read(a.id)
    assert changed.content_id != a.content_id
    assert changed.content_id == AdapterRegistry(model).read_path(path).content_id


def test_the_prefix_cache_never_serves_another_contents_kv(llama_sha, tmp_path, sha256) -> None:
    """Under sha256 ids: an evicted, unchanged adapter finds its KV warm with the same
    answer; a file changed on disk recomputes (cache_n 0) and answers as the new file does
    with the cache off; a copy under another name shares the KV of its content."""
    _, model = llama_sha
    lib = tmp_path / "lib"
    lib.mkdir()
    gguf_adapter(lib / "x.gguf", "llama", _pairs(5, 0.5))
    gguf_adapter(lib / "y.gguf", "llama", _pairs(6, 0.5))
    shutil.copy(lib / "x.gguf", lib / "x2.gguf")
    eng = Engine(
        model, EngineConfig(n_ctx=256, block_size=4, lora_dirs=(str(lib),), lora_max_loaded=1)
    )

    def served(name: str) -> tuple[list[int], int]:
        (evs,) = run_and_drain(eng, [ask(PROMPT, 6, lora=[(name, 1.0)])])
        assert evs[-1].error is None, evs[-1].error
        return tokens(evs), evs[-1].timings.cache_n

    def cache_off(name: str) -> list[int]:
        ref = Engine(model, EngineConfig(n_ctx=256, block_size=4, cache_ram_mib=0))
        a = ref.load_adapter(lib / f"{name}.gguf", 0.0).result()
        (evs,) = run_and_drain(ref, [ask(PROMPT, 6, lora=[(a.id, 1.0)], cache_prompt=False)])
        return tokens(evs)

    x, cache_n = served("x")
    assert cache_n == 0 and x == cache_off("x")
    y, _ = served("y")  # x goes back to disk
    assert y == cache_off("y") != x
    again, cache_n = served("x")
    assert again == x and cache_n == len(PROMPT) - 1  # its KV warm under its content
    twin, cache_n = served("x2")  # another name, the same content: the same KV
    assert twin == x and cache_n == len(PROMPT) - 1
    served("y")
    gguf_adapter(lib / "x.gguf", "llama", _pairs(7, 0.5))
    new, cache_n = served("x")
    assert cache_n == 0 and new == cache_off("x")
    ids = {a.name: a.content_id for a in eng.core.adapters.list()}
    assert len(ids["x"]) == 64 and ids["x"] != ids["x2"]


_CHILD = """
import json, sys
sys.modules["blake3"] = None  # `import blake3` raises ImportError, as on an install without it
import hashlib
import loraserve.lora.adapter as adapter
from loraserve.lora.registry import AdapterRegistry
from loraserve.model.loader import load_model
assert adapter._hasher is hashlib.sha256, adapter._hasher
reg = AdapterRegistry(load_model(sys.argv[1]))
print(json.dumps([reg.read_path(p).content_id for p in sys.argv[2:]]))
"""


def test_an_install_without_blake3_hashes_with_sha256(llama_sha, tmp_path, sha256) -> None:
    m, model = llama_sha
    t = _pairs(8)
    files = [
        gguf_adapter(tmp_path / "h.gguf", "llama", t, types=_f16(t)),
        gguf_adapter(tmp_path / "w.gguf", "llama", t),
    ]
    from tests.tiny import write_gguf

    base = write_gguf(tmp_path / "m.gguf", m, "llama")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(base), *map(str, files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    child = json.loads(out.stdout.strip().splitlines()[-1])
    here = [AdapterRegistry(model).read_path(p).content_id for p in files]
    assert child == here  # the fallback in a process without blake3 is the one tested here
