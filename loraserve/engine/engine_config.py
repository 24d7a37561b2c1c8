"""The engine's sizing (`EngineConfig`, mirroring llama-server's flags; `server/startup.py`
builds it from the command line) and the context one slot gets (`slot_context`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraserve.engine.spec.config import SpecConfig


def slot_context(config: EngineConfig) -> int:
    """The tokens one slot may hold: all of ``n_ctx`` with ``kv_unified`` (llama-server's
    unified KV; blocks are taken from the pool as sequences grow), else an equal share."""
    return config.n_ctx if config.kv_unified else max(config.n_ctx // config.n_slots, 1)


@dataclass(frozen=True)
class EngineConfig:
    """Engine sizing, mirroring llama-server's flags."""

    n_slots: int = 1  # -np
    n_ctx: int = 4096  # -c: KV tokens shared by the slots
    kv_unified: bool = False  # --kv-unified: each slot may use all n_ctx (else n_ctx / n_slots)
    ubatch: int = 512  # tokens per forward step (prefill chunking)
    block_size: int = 16
    cache_ram_mib: float = 8192  # budget for cached blocks no slot holds; -1 = unlimited
    # -cms: recurrent state snapshots at least this many tokens apart (in whole blocks; 0:
    # after every block), besides the one at the end of each prompt chunk (`cache.state`)
    checkpoint_min_step: int = 8192
    # -ctxcp: the most recurrent state checkpoints a slot keeps (llama-server's per-slot
    # --ctx-checkpoints, default 32; 0: none), `cache.state.StateStore`
    ctx_checkpoints: int = 32
    kv_dtype: torch.dtype = torch.float32
    spec: SpecConfig = SpecConfig()  # speculative decoding (off by default)
    # the adapter catalogue (--lora-dir, --lora-modules name/path/base) and its tiers
    lora_dirs: tuple[str, ...] = ()
    lora_modules: tuple[tuple[str, str, str | None], ...] = ()
    lora_max_loaded: int | None = None  # --lora-max-loaded
    lora_max_mib: float | None = None  # --lora-max-memory
    max_queue: int = 0  # --max-queue: requests waiting for a slot at most (0: unbounded)
    preempt_after_s: float = 0.0  # --preempt-after: see engine/preemption.py (0: never)
