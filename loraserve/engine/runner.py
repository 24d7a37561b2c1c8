"""The model runner: owns the KV tensors, turns a scheduled batch into one forward pass."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from loraserve.cache.state import SeqStep, StateStore
from loraserve.heap import after_growth
from loraserve.model.context import AttnMeta, LoraDelta, StepContext, set_context
from loraserve.model.decoder import Decoder
from loraserve.model.recurrent import kv_heads, state_shapes


@dataclass
class BatchItem:
    """``n`` tokens of one sequence starting at position ``start``; ``blocks`` is its table."""

    tokens: Sequence[int]  # the sequence's tokens (at least start + n)
    start: int
    n: int
    blocks: Sequence[int]
    want_logits: bool
    mix: Mapping[int, float]  # adapter id -> non-zero scale; empty: the base model
    hidden: tuple[int, int] | None = None  # offsets lo..hi-1 of the rows whose hidden
    # states an embedding request reads (`embedding.wanted_rows`)
    n_logits: int = 1  # with want_logits: logits of the last n_logits rows (a draft's rows)
    # aLoRA (`lora.alora`): (first position, scales) spans that replace ``mix``
    mixes: tuple[tuple[int, Mapping[int, float]], ...] = ()
    # recurrent models (`cache.state`): the slot and request id whose live state continues
    slot: int = -1
    seq: int = -1
    decode: bool = False  # rows the engine sampled (and a draft): `--scan-form chunked`
    # runs them in the recurrent form (`model.recurrent.chunked.gdn_scan`)


LoraBuilder = Callable[[list[tuple[int, int, Mapping[int, float]]]], LoraDelta | None]


class ModelRunner:
    """KV pool tensors per layer ``[capacity * block_size, n_kv_heads, head_dim]`` (no heads
    where the layer does not attend: a recurrent mixer or an FFN alone).

    ``lora`` builds a step's LoRA delta from its row spans (``(start, end, mix)`` for the
    rows whose mix is not empty); without it every row runs the base model. A model with
    recurrent layers keeps their states in ``states`` (its own store unless given one).
    """

    def __init__(
        self,
        decoder: Decoder,
        block_size: int,
        kv_dtype: torch.dtype,
        lora: LoraBuilder | None = None,
        states: StateStore | None = None,
    ) -> None:
        self.decoder = decoder
        self.cfg = decoder.cfg
        self.bs = block_size
        self.kv_dtype = kv_dtype
        self.capacity = 0
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.lora = lora
        if states is None and decoder.cfg.recurrent:
            states = StateStore(state_shapes(decoder.cfg), block_size)
        self.states = states
        # seq -> (its blocks, their slots): the tables of the last step's sequences
        self._slot_tables: dict[int, tuple[tuple[int, ...], torch.Tensor]] = {}
        self._next_tables: dict[int, tuple[tuple[int, ...], torch.Tensor]] = {}

    def ensure_capacity(self, n_blocks: int) -> None:
        """Grow the KV tensors to ``n_blocks`` blocks, keeping their contents, one layer at
        a time: each layer's old tensors go as its new ones are filled, so the old and new
        sizes coexist for one layer only (all layers at once, the prefix cache's growth
        from 2048 to 4096 blocks of Gemma 270M held 3456 MiB of KV for 2304)."""
        if n_blocks <= self.capacity:
            return
        cfg, n = self.cfg, n_blocks * self.bs
        new = []
        for i in range(cfg.n_layers):  # no heads where a layer does not attend
            k = torch.zeros(n, kv_heads(cfg, i), cfg.head_dim, dtype=self.kv_dtype)
            v = torch.zeros_like(k)
            if self.kv:
                old_k, old_v = self.kv[i]
                k[: old_k.shape[0]] = old_k
                v[: old_v.shape[0]] = old_v
                self.kv[i] = (k, v)  # the only reference to the old layer goes
                del old_k, old_v
            new.append((k, v))
        self.kv, self.capacity = new, n_blocks
        after_growth()  # the old layers' pages, and what their freeing left in the heaps

    def copy_block(self, src: int, dst: int, n: int) -> None:
        """Copy the first ``n`` token slots of block ``src`` into block ``dst`` (all layers)."""
        s, d = src * self.bs, dst * self.bs
        for k, v in self.kv:
            k[d : d + n] = k[s : s + n]
            v[d : d + n] = v[s : s + n]

    def block_slots(self, blocks: Sequence[int], n_tokens: int) -> torch.Tensor:
        """Flat KV slots of positions 0..n_tokens-1 -> [n_tokens] long."""
        pos = torch.arange(n_tokens)
        table = torch.tensor(list(blocks[: (n_tokens + self.bs - 1) // self.bs]), dtype=torch.long)
        return table[pos // self.bs] * self.bs + pos % self.bs

    def _seq_slots(self, seq: int, blocks: Sequence[int], n_tokens: int) -> torch.Tensor:
        """`block_slots` of sequence ``seq`` (-1: none), from the table its last step built
        over the same blocks when there is one (a decode step reuses it until it enters a
        new block): [n_tokens] long, a view the step only reads."""
        need = (n_tokens + self.bs - 1) // self.bs
        key = tuple(blocks[:need])
        hit = self._slot_tables.get(seq) if seq >= 0 else None
        if hit is None or hit[0] != key:
            hit = (key, self.block_slots(key, need * self.bs))
        if seq >= 0:
            self._next_tables[seq] = hit
        return hit[1][:n_tokens]

    def _context(
        self, items: Sequence[BatchItem]
    ) -> tuple[torch.Tensor, torch.Tensor, StepContext]:
        """The step's input ids [T], positions [T] and context. Every item, decode row or
        prefill chunk, attends its own sequence's keys 0..position through its slot list
        (``AttnMeta``), so one attention call per layer serves the whole batch."""
        ids: list[int] = []
        pos: list[int] = []
        nkeys: list[int] = []
        row_seq: list[int] = []
        seq_slots: list[torch.Tensor] = []  # per item: [start + n] slots of positions 0..
        new_slots: list[torch.Tensor] = []  # per item: [n] slots the new tokens write to
        seq_off = [0]
        logits_rows: list[int] = []
        hidden_rows: list[int] = []
        row = 0
        self._next_tables = {}
        for b, it in enumerate(items):
            if it.hidden is not None:
                hidden_rows.extend(range(row + it.hidden[0], row + it.hidden[1]))
            total = it.start + it.n
            ids.extend(it.tokens[it.start : total])
            pos.extend(range(it.start, total))
            nkeys.extend(range(it.start + 1, total + 1))
            row_seq.extend([b] * it.n)
            seq_slots.append(self._seq_slots(it.seq, it.blocks, total))
            new_slots.append(seq_slots[-1][it.start :])
            seq_off.append(seq_off[-1] + total)
            row += it.n
            if it.want_logits:
                logits_rows.extend(range(row - it.n_logits, row))
        self._slot_tables, self._next_tables = self._next_tables, {}
        positions = _tensor(pos)  # [T]
        one = len(items) == 1  # the tables' own views: nothing writes them
        attn = AttnMeta(
            slots=seq_slots[0] if one else torch.cat(seq_slots),
            seq_off=_tensor(seq_off),
            row_seq=_tensor(row_seq, "i"),
            row_nkeys=_tensor(nkeys, "i"),
            window=self.cfg.sliding_window,
        )
        lora = None
        if self.lora is not None:
            spans, r = [], 0
            for it in items:
                for lo, hi, mix in _mix_rows(it):
                    if mix:
                        spans.append((r + lo, r + hi, mix))
                r += it.n
            lora = self.lora(spans) if spans else None
        ctx = StepContext(
            slot_mapping=new_slots[0] if one else torch.cat(new_slots),
            attn=attn,
            logits_rows=_tensor(logits_rows),
            lora=lora,
            kv_caches=self.kv,
            hidden_rows=_tensor(hidden_rows) if hidden_rows else None,
        )
        if self.states is not None:  # each sequence's exact state (or StateMissing)
            ctx.states, r = [], 0
            for it in items:
                step = self.states.prepare(it.slot, it.seq, it.start, it.n, it.blocks, r,
                                           len(it.tokens))  # fmt: skip
                step.every = it.n_logits > 1 and it.slot >= 0  # a draft: rows kept (rollback)
                step.decode = it.decode
                ctx.states.append(step)
                r += it.n
        return _tensor(ids), positions, ctx

    def forward(self, items: Sequence[BatchItem]) -> torch.Tensor:
        """Run one step; returns logits [S, V] float32 for items with ``want_logits`` (the
        last ``n_logits`` rows of each, in order).
        ``self.hidden`` then holds, per item, the hidden rows it asked for (or None)."""
        input_ids, positions, ctx = self._context(items)
        set_context(ctx)
        try:
            logits = self.decoder(input_ids, positions)
        finally:
            set_context(None)
        if self.states is not None:  # the pass returned: keep its states
            steps: list[SeqStep] = ctx.states or []
            for it, step in zip(items, steps, strict=True):
                self.states.commit(it.slot, it.seq, it.start, step)
        self.hidden: list[torch.Tensor | None] = []
        off = 0
        for it in items:
            if it.hidden is None:
                self.hidden.append(None)
                continue
            h = it.hidden[1] - it.hidden[0]
            assert ctx.hidden is not None
            self.hidden.append(ctx.hidden[off : off + h])
            off += h
        return logits


def _tensor(values: list[int], code: str = "q") -> torch.Tensor:
    """[len(values)] int64 (``code`` "q") or int32 ("i"), the values' own buffer: a third of
    `torch.tensor`'s cost on a short list, which a decode step builds six of."""
    if not values:
        return torch.empty(0, dtype=torch.long if code == "q" else torch.int32)
    return torch.frombuffer(array(code, values), dtype=torch.long if code == "q" else torch.int32)


def _mix_rows(it: BatchItem) -> list[tuple[int, int, Mapping[int, float]]]:
    """An item's rows (offsets lo..hi-1) and the mix of each run of them."""
    if not it.mixes:
        return [(0, it.n, it.mix)]
    out = []
    for j, (first, mix) in enumerate(it.mixes):
        end = it.mixes[j + 1][0] if j + 1 < len(it.mixes) else it.start + it.n
        lo, hi = max(first, it.start) - it.start, min(end, it.start + it.n) - it.start
        if lo < hi:
            out.append((lo, hi, mix))
    return out
