"""The per-step context: attention metadata and LoRA routing for one forward pass.

The decoder's forward takes only ``(input_ids, positions)``; everything else that
describes the flat batch travels here, built once per step by the runner and read by
every layer (as nano-vllm does).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class LoraDelta(Protocol):
    """Adds the LoRA contribution of each token's adapter mix to a projection's output."""

    def apply(self, target: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return ``y`` plus the delta for base tensor ``target``; x: [T, in], y: [T, out]."""
        ...

    def apply_expert(
        self,
        target: str,
        expert: int,
        x: torch.Tensor,
        y: torch.Tensor,
        token_rows: torch.Tensor,
    ) -> torch.Tensor:
        """The same for one expert of a stacked target (``blk.N.ffn_up_exps.weight``).

        x: [m, in], y: [m, out] hold the rows routed to ``expert``; token_rows: [m] long,
        their rows in the flat batch (which select each row's adapter mix).
        """
        ...


@dataclass
class AttnMeta:
    """Which keys each query row of the step attends, as the attention kernel reads them.

    Decode rows and prefill chunks alike: row t attends positions 0..row_nkeys[t]-1 of
    sequence row_seq[t] (sliding-window layers only the last ``window`` of them),
    whose KV slots are ``slots[seq_off[b]:seq_off[b + 1]]`` in position order.
    """

    slots: torch.Tensor  # [N] long: every sequence's KV slots for positions 0, 1, ...
    seq_off: torch.Tensor  # [B + 1] long: offsets of each sequence's slots in ``slots``
    row_seq: torch.Tensor  # [T] int32: the sequence of each query row
    row_nkeys: torch.Tensor  # [T] int32: keys each row attends (its position + 1)
    window: int = 0  # sliding-window layers' window (cfg.sliding_window; 0 = none)


@dataclass
class StepContext:
    """Everything a forward pass needs besides ``(input_ids, positions)``."""

    slot_mapping: torch.Tensor  # [T] long: flat KV slot each new token writes to
    attn: AttnMeta
    logits_rows: torch.Tensor  # [S] long: rows whose logits are needed
    lora: LoraDelta | None = None
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # embeddings hook (engine requests with pooling): the decoder leaves the final-norm
    # hidden states of rows ``hidden_rows`` [H] long in ``hidden`` [H, hidden_size]
    hidden_rows: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    # recurrent layers (`model/recurrent/`): one `cache.state.SeqStep` per sequence of the step
    states: list[Any] | None = None


# Thread-local: each engine thread runs its own forward passes (tests and tools may run
# several engines, even over one shared decoder, in different threads).
_LOCAL = threading.local()


def set_context(ctx: StepContext | None) -> None:
    """Install the context for forward passes on this thread (None clears it)."""
    _LOCAL.ctx = ctx


def get_context() -> StepContext:
    """The context of the forward pass running on this thread."""
    ctx = getattr(_LOCAL, "ctx", None)
    if ctx is None:
        raise RuntimeError("no step context: the forward pass must run inside the runner")
    return ctx
