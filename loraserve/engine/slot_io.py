"""Save, restore and erase a slot's KV (`POST /slots/{id}?action=save|restore|erase`).

A slot file is a safetensors file: `tokens` [n] int64 and per layer `k.{i}`, `v.{i}`
[n, n_kv_heads, head_dim] in the KV dtype (no heads at a layer that does not attend), a
recurrent model's states (`slot_states`: snapshots after blocks, the state at the slot's end
and its checkpoints), with metadata naming the format, the model
(architecture, KV shape and the SHA-256 of its weight files, so a slot never restores onto
other weights) and the **cache key** the KV was computed under. A restore
indexes the KV in the prefix cache under that saved key, so only a request whose
effective adapter configuration has the same key can reuse it.

`capture`, `install` and `erase` touch engine state: the engine runs them on its thread
(`Engine.save_slot`, `restore_slot`, `erase_slot`). They return None when the slot is
busy. `write` and `read` are plain file I/O for any thread; `write` never replaces a file that is
not a slot file (a client naming `notes.txt` gets an error, the file stays).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from loraserve.cache.block_pool import OutOfBlocks
from loraserve.cache.prefix_cache import CacheKey, Spans
from loraserve.engine.runner import ModelRunner
from loraserve.engine.scheduler import Scheduler
from loraserve.engine.slot_keys import decode_key, encode_key
from loraserve.engine.slot_states import SlotStates, check, grab, put
from loraserve.engine.slot_states import read as read_states
from loraserve.engine.slot_states import tensors as state_tensors
from loraserve.model.loader import LoadedModel
from loraserve.model.recurrent import kv_heads

FORMAT = "loraserve-slot-1"


class SlotFileError(ValueError):
    """A slot file that cannot be restored here (corrupt, other model, too long)."""


@dataclass
class SlotImage:
    """A slot's retained sequence: its tokens, their KV per layer, and its cache key."""

    tokens: list[int]
    cache_key: CacheKey | Spans
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer ([n, kvh, hd], [n, kvh, hd])
    # recurrent layers: full block j -> recurrent layer -> its state after the block's last
    # token (`cache.state` snapshots), so a restored prefix resumes from the exact state
    states: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)
    # the states after all the tokens (a next turn resumes there) and the slot's checkpoints
    # (position -> states): `slot_states`
    live: dict[int, torch.Tensor] | None = None
    ckpts: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)

    @property
    def recurrent(self) -> SlotStates:
        """The image's recurrent states as `slot_states` takes them."""
        return SlotStates(self.states, self.live, self.ckpts)


def weights_sha256(path: Path) -> str:
    """The SHA-256 of a model's weights: of the GGUF file itself, or for an HF folder of its
    config and weight files' names and SHA-256s (in name order). Computed once per file
    version (reads the whole model: call it off the event loop)."""
    path = Path(os.path.realpath(path))
    if not path.is_dir():
        return _file_sha256(str(path), path.stat().st_size, path.stat().st_mtime_ns)
    h = hashlib.sha256()
    for p in sorted(path.iterdir()):
        if p.is_file() and (p.suffix in (".safetensors", ".bin") or p.name == "config.json"):
            h.update(p.name.encode() + b"\0")
            h.update(bytes.fromhex(_file_sha256(str(p), p.stat().st_size, p.stat().st_mtime_ns)))
    return h.hexdigest()


@functools.lru_cache(maxsize=64)
def _file_sha256(name: str, size: int, mtime_ns: int) -> str:
    """A file's SHA-256 (cached per name, size and modification time)."""
    with open(name, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fingerprint(model: LoadedModel) -> dict[str, object]:
    """What a slot file must match to be restored into an engine serving `model` (reads
    the weights once to hash them: call it off the event loop)."""
    cfg = model.config
    return {
        "weights_sha256": weights_sha256(model.path),
        "model": model.name,
        "arch": cfg.arch,
        "n_layers": cfg.n_layers,
        "n_kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        # a recurrent model's cache has no KV heads where a layer does not attend
        **({"kv_heads": [kv_heads(cfg, i) for i in range(cfg.n_layers)]} if cfg.recurrent else {}),
        # the chunked scans' states are other records (`--scan-form chunked`); since the
        # delta-net's decode runs the recurrence they carry its state too
        **({"scan_chunk": cfg.scan_chunk, "scan_decode": "recurrent"} if cfg.scan_chunk else {}),
    }


def capture(sched: Scheduler, runner: ModelRunner, slot_id: int) -> SlotImage | None:
    """Engine thread: a copy of what the idle slot retains (None if it is busy)."""
    slot = sched.slots[slot_id]
    if slot.busy:
        return None
    n = len(slot.tokens)
    idx = runner.block_slots(slot.blocks, n)
    kv = [(k[idx].clone(), v[idx].clone()) for k, v in runner.kv]
    st = grab(runner.states, slot, sched.bs) if runner.states is not None else SlotStates()
    return SlotImage(list(slot.tokens), slot.cache_key, kv, st.snaps, st.live, st.ckpts)


def install(sched: Scheduler, runner: ModelRunner, slot_id: int, image: SlotImage) -> int | None:
    """Engine thread: make the idle slot retain `image` (its previous blocks go to the
    cache) and index the KV under the image's cache key. Returns the token count, or
    None if the slot is busy. `OutOfBlocks` if the pool cannot hold it."""
    slot = sched.slots[slot_id]
    if slot.busy:
        return None
    cache = sched.cache
    bs = cache.bs
    if runner.states is not None or image.states or image.live or image.ckpts:
        shapes = runner.states.shapes if runner.states is not None else {}
        why = check(image.recurrent, len(image.tokens), shapes, bs)
        if why is not None:
            raise SlotFileError(why)
    old, slot.blocks, slot.tokens, slot.cache_key = slot.blocks, [], [], ()
    cache.release(old)
    n = len(image.tokens)
    blocks: list[int] = []
    try:
        for _ in range((n + bs - 1) // bs):
            blocks.append(cache.allocate())
    except OutOfBlocks:
        cache.release(blocks)
        raise
    runner.ensure_capacity(cache.pool.capacity)
    idx = runner.block_slots(blocks, n)
    for (k, v), (fk, fv) in zip(runner.kv, image.kv, strict=True):
        k[idx] = fk.to(k.dtype)
        v[idx] = fv.to(v.dtype)
    slot.tokens, slot.blocks, slot.cache_key = list(image.tokens), blocks, image.cache_key
    if runner.states is not None:  # snapshots, and the slot's own state at its end
        put(runner.states, slot, image.recurrent, blocks)
    cache.insert(image.cache_key, image.tokens, blocks)
    # the slot holds no request's sequence now: its last request no longer describes it
    # (`/slots` under --cache-isolation key credits a restore by this, atomically with it)
    slot.last_request = None
    slot.last_used = time.perf_counter()
    cache.enforce_budget()
    return n


def erase(sched: Scheduler, slot_id: int) -> int | None:
    """Engine thread: the idle slot forgets its sequence (its blocks go to the prefix
    cache like any finished request's, within `--cache-ram`). Returns the tokens erased,
    or None if the slot is busy."""
    slot = sched.slots[slot_id]
    if slot.busy:
        return None
    n, blocks = len(slot.tokens), slot.blocks
    slot.blocks, slot.tokens, slot.cache_key, slot.live = [], [], (), None
    if sched.cache.states is not None:  # its live state and checkpoints go with it
        sched.cache.states.forget(slot_id)
    sched.cache.release(blocks)
    return n


def is_slot_file(path: Path) -> bool:
    """Whether `path` is a slot file of ours (safetensors with our format in its header)."""
    try:
        with safe_open(str(path), "pt") as f:
            return (f.metadata() or {}).get("format") == FORMAT
    except Exception:  # safetensors raises its own types on other files
        return False


_WRITING = threading.Lock()  # one save at a time: the budget check and the write as one


def _slot_bytes(folder: Path, skip: Path) -> int:
    """Bytes the slot files of ours in ``folder`` take, the file ``skip`` (to be replaced)
    and other files left out."""
    total = 0
    for entry in os.scandir(folder):
        p = Path(entry.path)
        if entry.is_file(follow_symlinks=False) and p != skip and is_slot_file(p):
            total += entry.stat(follow_symlinks=False).st_size
    return total


def write(path: Path, image: SlotImage, fp: dict[str, object], budget: int = -1) -> int:
    """Write `image` atomically to `path` (a symlink there is replaced, not followed);
    returns the bytes written. `SlotFileError` if a regular file there is not a slot file
    of ours (it is left as it is), or if the folder's slot files would take more than
    ``budget`` bytes with this one (-1: no limit; a file replaced no longer counts)."""
    with _WRITING:
        return _write(path, image, fp, budget)


def _write(path: Path, image: SlotImage, fp: dict[str, object], budget: int) -> int:
    if path.is_file() and not path.is_symlink() and not is_slot_file(path):
        raise SlotFileError(f"{path.name}: exists and is not a loraserve slot file; not replaced")
    tensors = {"tokens": torch.tensor(image.tokens, dtype=torch.int64)}
    for i, (k, v) in enumerate(image.kv):
        tensors[f"k.{i}"], tensors[f"v.{i}"] = k.contiguous(), v.contiguous()
    tensors.update(state_tensors(image.recurrent))
    if budget >= 0:
        need = sum(t.numel() * t.element_size() for t in tensors.values())
        held = _slot_bytes(path.parent, path)
        if held + need > budget:
            mib = 2**20
            raise SlotFileError(
                f"{path.name}: {need / mib:.1f} MiB more would pass the slot files' budget "
                f"(--slot-save-max {budget // mib} MiB, {held / mib:.1f} MiB held): "
                "erase or overwrite a saved slot"
            )
    meta = {
        "format": FORMAT,
        "fingerprint": json.dumps(fp, sort_keys=True),
        "cache_key": json.dumps(encode_key(image.cache_key)),
    }
    fd, tmp = tempfile.mkstemp(prefix=".slot-", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path.stat().st_size


def read(path: Path, fp: dict[str, object], max_tokens: int) -> SlotImage:
    """Read and check a slot file written by `write` for a model with fingerprint `fp`
    (recurrent states: checked against the model when installed)."""
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise SlotFileError(f"{path.name}: not a loraserve slot file")
            saved = json.loads(meta.get("fingerprint", "null"))
            if saved != fp:
                raise SlotFileError(
                    f"{path.name}: saved from another model ({_differs(saved, fp)})"
                )
            cache_key = decode_key(json.loads(meta["cache_key"]))
            n_layers = int(fp["n_layers"])  # type: ignore[call-overload]
            heads = fp.get("kv_heads") or [fp["n_kv_heads"]] * n_layers
            dim = int(fp["head_dim"])  # type: ignore[call-overload]
            (n,) = f.get_slice("tokens").get_shape()
            if n > max_tokens:
                raise SlotFileError(f"{path.name}: {n} tokens do not fit a slot ({max_tokens})")
            for i in range(n_layers):
                shape = [n, int(heads[i]), dim]  # type: ignore[index]
                for part in "kv":
                    if list(f.get_slice(f"{part}.{i}").get_shape()) != shape:
                        raise SlotFileError(f"{path.name}: tensor {part}.{i} has a wrong shape")
            tokens = f.get_tensor("tokens").tolist()
            kv = [(f.get_tensor(f"k.{i}"), f.get_tensor(f"v.{i}")) for i in range(n_layers)]
            st = read_states(list(f.keys()), f.get_tensor)
    except SlotFileError:
        raise
    except Exception as e:  # safetensors raises its own types on corrupt files
        raise SlotFileError(f"{path.name}: cannot read the slot file: {e}") from None
    vocab = int(fp["vocab_size"])  # type: ignore[call-overload]
    if any(not 0 <= t < vocab for t in tokens):
        raise SlotFileError(f"{path.name}: token ids out of the vocabulary")
    return SlotImage(tokens, cache_key, kv, st.snaps, st.live, st.ckpts)


def _differs(saved: object, here: dict[str, object]) -> str:
    """Which fingerprint entries differ, as `key: file's != this server's`."""
    if not isinstance(saved, dict):
        return "no fingerprint"
    keys = [k for k in sorted({*saved, *here}) if saved.get(k) != here.get(k)]
    return "; ".join(f"{k}: {saved.get(k)!r} in the file, {here.get(k)!r} here" for k in keys)
