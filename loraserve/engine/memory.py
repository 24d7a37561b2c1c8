"""The KV block pool, prefix cache and recurrent state store of one engine, sized from its
flags: every slot's context held at once, plus what `--cache-ram` lets the cache keep."""

from __future__ import annotations

from loraserve.cache.block_pool import BlockPool
from loraserve.cache.prefix_cache import PrefixCache
from loraserve.cache.state import StateStore
from loraserve.engine.engine_config import EngineConfig
from loraserve.model.config import ModelConfig
from loraserve.model.recurrent import kv_heads, state_shapes


def build_cache(
    cfg: ModelConfig, config: EngineConfig, n_ctx_slot: int
) -> tuple[BlockPool, PrefixCache, StateStore | None]:
    """The pool, the cache over it, and (recurrent models) the state store beside the KV.

    A block costs its K and V across the layers that attend; a recurrent model's block may
    also carry the state snapshot that follows it (one every `--checkpoint-min-step` tokens,
    in blocks), and a cached block without one costs only its KV's share of a budget unit.
    """
    bs = config.block_size
    per_slot = (n_ctx_slot + bs - 1) // bs + 1
    heads = sum(kv_heads(cfg, i) for i in range(cfg.n_layers))  # attending layers only
    block_bytes = 2 * heads * bs * cfg.head_dim * config.kv_dtype.itemsize
    every = max(1, -(-config.checkpoint_min_step // bs))  # in blocks
    states = None
    if cfg.recurrent:
        states = StateStore(
            state_shapes(cfg), bs, every, block_bytes, config.ctx_checkpoints,
            config.checkpoint_min_step,
        )  # fmt: skip
    if states is not None:
        block_bytes += states.snapshot_bytes
    held = config.n_slots * (per_slot + 1)
    if config.cache_ram_mib < 0:
        budget = None
        max_blocks = held * 8
    else:
        budget = int(config.cache_ram_mib * 2**20 // block_bytes)
        share = states.kv_share if states is not None else 1.0
        max_blocks = held + (int(budget / share) if share > 0 else budget)
    pool = BlockPool(bs, max_blocks, initial_blocks=min(held, 256))
    return pool, PrefixCache(pool, budget, states), states
