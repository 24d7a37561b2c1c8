"""A saved slot's recurrent states (`slot_io`): what a recurrent model's slot file carries
beside its KV, so a restored slot resumes exactly where the saved one could.

- **snapshots**: full block j -> every recurrent layer's state after that block's last token
  (the prefix cache's `cache.state` snapshots of the slot's blocks); a prefix hit on the
  restored blocks resumes there;
- the **live end**: the states after all the slot's tokens (the state its last sequence
  stopped at), so a next turn that extends them resumes at that exact position, inside a
  block, as in the engine that saved it (`Scheduler._live_match`);
- the slot's **checkpoints** (llama-server's ``--ctx-checkpoints``): position -> states
  there, where its prompts began and 4 tokens before their ends (`StateStore.resume_point`).

All of them are the saved sequence's own, under the file's cache key: a restore hands them
to the slot under that key alone (the scheduler only continues a slot's state for a request
with the slot's cache key), never to another adapter mix. In the file: ``state.{j}.{i}``,
``live.{i}`` and ``ckpt.{p}.{i}`` for recurrent layer i, float32 in its state's shape.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from loraserve.cache.state import States, StateStore
from loraserve.engine.slot import Slot

_restored = itertools.count(-1, -1)  # sequence ids of restored states (requests' are > 0)


@dataclass
class SlotStates:
    """A slot's recurrent states as saved: snapshots after full blocks, the live end, the
    checkpoints (all empty for a model without recurrent layers)."""

    snaps: dict[int, States] = field(default_factory=dict)  # full block j -> states after it
    live: States | None = None  # states after every token of the slot
    ckpts: dict[int, States] = field(default_factory=dict)  # position -> states there


def grab(store: StateStore, slot: Slot, bs: int) -> SlotStates:
    """The states an idle ``slot`` retains: its full blocks' snapshots, and where the slot
    still holds its last sequence's state (`Slot.live`) that state at its end and its
    checkpoints (references: states are never changed in place)."""
    n = len(slot.tokens)
    out = SlotStates()
    for j, b in enumerate(slot.blocks[: n // bs]):
        if store.has(b):
            out.snaps[j] = dict(store.snaps[b])
    live = store.live.get(slot.id)
    if slot.live is None or slot.live[1] is not slot.tokens or live is None:
        return out
    if live.seq != slot.live[0]:
        return out
    end = live.at.get(n)
    if end is not None:
        out.live = dict(end)
    out.ckpts = {p: dict(s) for p, s in live.ckpts.items() if 0 < p <= n}
    return out


def check(st: SlotStates, n: int, shapes: dict[int, tuple[int, ...]], bs: int) -> str | None:
    """Why ``st`` (saved with ``n`` tokens) does not fit a model whose recurrent layers'
    states have ``shapes``; None if it does."""
    parts: list[tuple[str, States]] = [(f"after block {j}", s) for j, s in st.snaps.items()]
    if any(not 0 <= j < n // bs for j in st.snaps):
        return "recurrent state after a block past the slot's tokens"
    if any(not 0 < p <= n for p in st.ckpts):
        return "recurrent checkpoint past the slot's tokens"
    parts += [(f"at checkpoint {p}", s) for p, s in st.ckpts.items()]
    if st.live is not None:
        parts.append(("at the slot's end", st.live))
    for where, s in parts:
        if set(s) != set(shapes):
            return f"recurrent state {where} does not fit this model"
        for i, t in s.items():
            if tuple(t.shape) != tuple(shapes[i]) or t.dtype != torch.float32:
                return f"recurrent state of layer {i} {where} has a wrong shape"
            if not bool(torch.isfinite(t).all()):
                return f"recurrent state of layer {i} {where} is not finite"
    return None


def put(store: StateStore, slot: Slot, st: SlotStates, blocks: list[int]) -> None:
    """Install ``st`` for ``slot``, which now retains the saved tokens in ``blocks``: the
    snapshots under their blocks, and the live end and checkpoints as the slot's own state
    of a new sequence (`Slot.live` names it with the slot's token list), continued only by
    a request under the slot's cache key. Without a live end the slot holds no state of a
    sequence (the state of what ran in it before is forgotten)."""
    for j, s in st.snaps.items():
        store.snaps[blocks[j]] = s
    store.forget(slot.id)
    slot.live = None
    if st.live is None:
        return
    seq = next(_restored)
    store.seat(slot.id, seq, len(slot.tokens), st.live, st.ckpts)
    slot.live = (seq, slot.tokens)


def tensors(st: SlotStates) -> dict[str, torch.Tensor]:
    """``st`` as the slot file's tensors (names in the module's docstring)."""
    out = {}
    for j, s in st.snaps.items():
        out.update({f"state.{j}.{i}": t.contiguous() for i, t in s.items()})
    for p, s in st.ckpts.items():
        out.update({f"ckpt.{p}.{i}": t.contiguous() for i, t in s.items()})
    if st.live is not None:
        out.update({f"live.{i}": t.contiguous() for i, t in st.live.items()})
    return out


def read(names: list[str], get: object) -> SlotStates:
    """The states among a slot file's tensor ``names`` (``get(name)`` reads one)."""
    st = SlotStates()
    for name in names:
        parts = name.split(".")
        if parts[0] == "state" and len(parts) == 3:
            st.snaps.setdefault(int(parts[1]), {})[int(parts[2])] = get(name)  # type: ignore[operator]
        elif parts[0] == "ckpt" and len(parts) == 3:
            st.ckpts.setdefault(int(parts[1]), {})[int(parts[2])] = get(name)  # type: ignore[operator]
        elif parts[0] == "live" and len(parts) == 2:
            if st.live is None:
                st.live = {}
            st.live[int(parts[1])] = get(name)  # type: ignore[operator]
    return st
