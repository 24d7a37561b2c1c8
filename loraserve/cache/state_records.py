"""The records the recurrent-state store keeps and hands to the recurrent layers: a
sequence's part of a step (`SeqStep`), a slot's live states and checkpoints (`LiveState`),
and the error for a position with no exact state."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class StateMissing(RuntimeError):
    """No exact recurrent state exists for the position a step starts from."""


States = dict[int, torch.Tensor]  # recurrent layer index -> its state (shape per layer kind)


@dataclass
class SeqStep:
    """One sequence's part of a step, as the recurrent layers read and write it.

    Rows ``lo..hi-1`` of the flat batch are its tokens; ``state`` is every recurrent layer's
    state before row ``lo``. Each layer writes its state after row ``hi - 1`` into ``out`` and,
    for each ``(r, block)`` of ``cuts``, its state after row ``lo + r`` into ``snaps[block]``.
    """

    lo: int
    hi: int
    state: States
    cuts: list[tuple[int, int]]
    out: States = field(default_factory=dict)
    snaps: dict[int, States] = field(default_factory=dict)
    every: bool = False
    decode: bool = False  # its rows are tokens the engine sampled (a decode row, a draft's)
    rows: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    end_only: int = -1  # the block of a cut made for the chunk's end alone (off the interval)
    latest: int = -1  # the block a decode step's cut ends off the interval (see `commit`)


@dataclass
class LiveState:
    """A slot's running sequence: its states by position and its checkpoints."""

    seq: int  # the request id running in the slot
    at: dict[int, States]  # position -> states there (the last step's start and end, and
    # with a draft every position in between)
    latest: int = -1  # the block of its latest decode snapshot off the interval
    # position -> states where each of its prompts (and its predecessors' in the slot) began
    # from this live state: llama-server's checkpoint before a prompt's last batch
    ckpts: dict[int, States] = field(default_factory=dict)
    owners: dict[int, int] = field(default_factory=dict)  # position -> the request that made it
