"""The per-step context: attention metadata and LoRA routing for one forward pass.

The decoder's forward takes only ``(input_ids, positions)``; everything else that
describes the flat batch travels here, built once per step by the runner and read by
every layer (as nano-vllm does).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

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
class AttnGroup:
    """Rows of the flat batch that attend over gathered KV with one padded SDPA call.

    A group is either all decode rows (one query each, several sequences) or one
    prefill chunk (several queries of one sequence).
    """

    rows: torch.Tensor | None  # [n] long rows of the flat batch; None = rows start..end
    start: int
    end: int
    kv_index: torch.Tensor  # [B, L] long: flat KV slots to gather per sequence
    mask_full: torch.Tensor  # [B, 1, Q, L] bool: True = attend (causal, padding)
    mask_swa: torch.Tensor | None  # same, also restricted to the sliding window
    n_seqs: int  # B: sequences in the group (Q = queries per sequence)
    # sliding-window layers gather only the window: its KV slots [B, W'] (mask_swa is
    # then [B, 1, Q, W']); None = kv_index with mask_swa
    kv_index_swa: torch.Tensor | None = None
    # additive float masks (0 / -inf) of mask_full / mask_swa, built on first use
    bias: dict[bool, torch.Tensor] = field(default_factory=dict)


@dataclass
class StepContext:
    """Everything a forward pass needs besides ``(input_ids, positions)``."""

    slot_mapping: torch.Tensor  # [T] long: flat KV slot each new token writes to
    groups: list[AttnGroup]
    logits_rows: torch.Tensor  # [S] long: rows whose logits are needed
    lora: LoraDelta | None = None
    # rows of generated tokens, which use int8 weights where a layer has them (None: no
    # such row); prompt rows always use float weights, whatever the batch holds
    int8_rows: torch.Tensor | None = None
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


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
