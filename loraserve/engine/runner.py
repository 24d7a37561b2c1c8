"""The model runner: owns the KV tensors, turns a scheduled batch into one forward pass."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from loraserve.model.context import AttnGroup, LoraDelta, StepContext, set_context
from loraserve.model.decoder import Decoder


@dataclass
class BatchItem:
    """``n`` tokens of one sequence starting at position ``start``; ``blocks`` is its table."""

    tokens: Sequence[int]  # the sequence's tokens (at least start + n)
    start: int
    n: int
    blocks: Sequence[int]
    want_logits: bool
    lora_mix: dict[int, float]
    generated: bool = False  # a generated token (decode), not a prompt token


LoraBuilder = Callable[[list[tuple[int, int, dict[int, float]]]], LoraDelta | None]


class ModelRunner:
    """KV pool tensors per layer ``[capacity * block_size, n_kv_heads, head_dim]``."""

    def __init__(self, decoder: Decoder, block_size: int, kv_dtype: torch.dtype) -> None:
        self.decoder = decoder
        self.cfg = decoder.cfg
        self.bs = block_size
        self.kv_dtype = kv_dtype
        self.capacity = 0
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.lora_builder: LoraBuilder | None = None

    def ensure_capacity(self, n_blocks: int) -> None:
        """Grow the KV tensors to ``n_blocks`` blocks, keeping their contents."""
        if n_blocks <= self.capacity:
            return
        cfg, n = self.cfg, n_blocks * self.bs
        new = []
        for i in range(cfg.n_layers):
            k = torch.zeros(n, cfg.n_kv_heads, cfg.head_dim, dtype=self.kv_dtype)
            v = torch.zeros_like(k)
            if self.kv:
                old_k, old_v = self.kv[i]
                k[: old_k.shape[0]] = old_k
                v[: old_v.shape[0]] = old_v
            new.append((k, v))
        self.kv, self.capacity = new, n_blocks

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

    def _context(
        self, items: Sequence[BatchItem]
    ) -> tuple[torch.Tensor, torch.Tensor, StepContext]:
        ids, pos, slots = [], [], []
        logits_rows: list[int] = []
        decode_rows: list[int] = []
        decode_items: list[BatchItem] = []
        groups: list[AttnGroup] = []
        window = self.cfg.sliding_window
        row = 0
        int8_rows: list[int] = []
        for it in items:
            if it.generated:
                int8_rows.extend(range(row, row + it.n))
            ids.extend(it.tokens[it.start : it.start + it.n])
            pos.extend(range(it.start, it.start + it.n))
            total = it.start + it.n
            kv_index = self.block_slots(it.blocks, total)
            slots.append(kv_index[it.start :])
            if it.n == 1:
                decode_rows.append(row)
                decode_items.append(it)
            else:
                q = torch.arange(it.start, total).unsqueeze(1)  # [Q, 1]
                k = torch.arange(total).unsqueeze(0)  # [1, L]
                full = k <= q
                swa = full & (q - k < window) if window else None
                lo = max(0, it.start - window + 1) if window else 0  # first key in a window
                groups.append(
                    AttnGroup(
                        None,
                        row,
                        row + it.n,
                        kv_index.unsqueeze(0),
                        full[None, None],
                        None if swa is None else swa[None, None, :, lo:],
                        1,
                        kv_index_swa=kv_index[lo:].unsqueeze(0) if lo else None,
                    )
                )
            row += it.n
            if it.want_logits:
                logits_rows.append(row - 1)
        if decode_items:
            lens = [it.start + 1 for it in decode_items]
            max_len = max(lens)
            kv_index = torch.zeros(len(decode_items), max_len, dtype=torch.long)
            for j, it in enumerate(decode_items):
                own = self.block_slots(it.blocks, lens[j])
                # padding repeats the sequence's own newest slot: masked keys still enter
                # SDPA's weighted sum (0 * x), so they must never be another request's KV
                kv_index[j] = own[-1]
                kv_index[j, : lens[j]] = own
            k = torch.arange(max_len).unsqueeze(0)  # [1, L]
            qpos = torch.tensor(lens).unsqueeze(1) - 1  # [B, 1]
            full = k <= qpos
            swa = full & (qpos - k < window) if window else None
            kv_swa = None
            if window and max_len > window:  # gather only each sequence's last `window`
                kv_swa, swa = _window(kv_index, torch.tensor(lens), window)
            groups.append(
                AttnGroup(
                    torch.tensor(decode_rows),
                    0,
                    0,
                    kv_index,
                    full[:, None, None, :],
                    None if swa is None else swa[:, None, None, :],
                    len(decode_items),
                    kv_index_swa=kv_swa,
                )
            )
        lora = None
        if self.lora_builder is not None:
            spans, r = [], 0
            for it in items:
                if it.lora_mix:
                    spans.append((r, r + it.n, it.lora_mix))
                r += it.n
            lora = self.lora_builder(spans) if spans else None
        ctx = StepContext(
            slot_mapping=torch.cat(slots),
            groups=groups,
            logits_rows=torch.tensor(logits_rows, dtype=torch.long),
            lora=lora,
            kv_caches=self.kv,
            int8_rows=torch.tensor(int8_rows, dtype=torch.long) if int8_rows else None,
        )
        return torch.tensor(ids, dtype=torch.long), torch.tensor(pos, dtype=torch.long), ctx

    def forward(self, items: Sequence[BatchItem]) -> torch.Tensor:
        """Run one step; returns logits [S, V] float32 for items with ``want_logits``."""
        input_ids, positions, ctx = self._context(items)
        set_context(ctx)
        try:
            return self.decoder(input_ids, positions)
        finally:
            set_context(None)


def _window(
    kv_index: torch.Tensor, lens: torch.Tensor, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode rows' last ``window`` KV slots: kv_index [B, L], lens [B] -> ([B, W] slots,
    [B, W] keep mask); a shorter sequence is padded with its own newest slot, masked."""
    start = (lens - window).clamp(min=0)  # [B] first key inside the window
    cols = start[:, None] + torch.arange(window)[None, :]  # [B, W]
    keep = cols < lens[:, None]
    cols = torch.minimum(cols, (lens - 1)[:, None])
    return kv_index.gather(1, cols), keep
