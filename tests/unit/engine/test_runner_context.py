"""The runner's step metadata (`ModelRunner._context`) against its definition, step after
step: a decode step reuses its sequence's KV slot table (issue 28), so every table must
still be the one `block_slots` computes from the sequence's blocks of that step, also when
a block of the table is replaced in place (copy on write), a block is added, the sequence
changes or no sequence id is given."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from loraserve.engine.runner import BatchItem, ModelRunner

BS = 4


def _runner() -> ModelRunner:
    cfg = SimpleNamespace(recurrent=False, sliding_window=0)
    return ModelRunner(SimpleNamespace(cfg=cfg), BS, torch.float32)  # type: ignore[arg-type]


def _reference(items: list[BatchItem]) -> dict[str, list[int]]:
    """Each field of the context from its definition, position by position."""
    out: dict[str, list[int]] = {k: [] for k in ("ids", "pos", "slots", "new", "off", "seq",
                                                 "nkeys", "logits")}  # fmt: skip
    out["off"].append(0)
    row = 0
    for b, it in enumerate(items):
        total = it.start + it.n
        table = [it.blocks[p // BS] * BS + p % BS for p in range(total)]
        out["ids"] += list(it.tokens[it.start : total])
        out["pos"] += list(range(it.start, total))
        out["slots"] += table
        out["new"] += table[it.start :]
        out["off"].append(out["off"][-1] + total)
        out["seq"] += [b] * it.n
        out["nkeys"] += [p + 1 for p in range(it.start, total)]
        row += it.n
        if it.want_logits:
            out["logits"] += list(range(row - it.n_logits, row))
    return out


def _check(runner: ModelRunner, items: list[BatchItem]) -> None:
    ids, pos, ctx = runner._context(items)
    want = _reference(items)
    got = {"ids": ids, "pos": pos, "slots": ctx.attn.slots, "new": ctx.slot_mapping,
           "off": ctx.attn.seq_off, "seq": ctx.attn.row_seq, "nkeys": ctx.attn.row_nkeys,
           "logits": ctx.logits_rows}  # fmt: skip
    dtypes = {"seq": torch.int32, "nkeys": torch.int32}
    for name, t in got.items():
        assert t.dtype == dtypes.get(name, torch.long), name
        assert t.tolist() == want[name], name


def _item(seq: int, blocks: list[int], start: int, n: int, logits: bool = True) -> BatchItem:
    tokens = [(7 * i + seq) % 50 for i in range(start + n)]
    return BatchItem(tokens, start, n, blocks, logits, {}, seq=seq)


def test_decode_steps_follow_their_blocks() -> None:
    runner = _runner()
    blocks = [5, 2]
    _check(runner, [_item(1, blocks, 0, 6)])  # a prompt chunk
    for start in range(6, 8):  # decode rows in the same blocks: the kept table
        _check(runner, [_item(1, blocks, start, 1)])
    blocks.append(9)  # a new block
    _check(runner, [_item(1, blocks, 8, 1)])
    blocks[1] = 11  # copy on write: a block of the table replaced in place
    _check(runner, [_item(1, blocks, 9, 1)])
    _check(runner, [_item(2, [5, 3, 4], 9, 1)])  # another sequence, an overlapping table


def test_batches_and_sequences_without_id() -> None:
    runner = _runner()
    a, b = [1, 2, 3], [4, 6]
    _check(runner, [_item(1, a, 9, 1), _item(2, b, 5, 1)])
    _check(runner, [_item(2, b, 6, 1), _item(1, a, 10, 1)])  # the order swapped
    _check(runner, [_item(-1, [8], 0, 3, logits=False), _item(-1, [7, 0], 4, 2)])
    _check(runner, [_item(-1, [7, 9], 4, 2)])  # no id: never a table of another step
    b[0] = 12
    _check(runner, [_item(1, a, 11, 1), _item(2, b, 7, 1), _item(3, [10], 0, 2, logits=False)])
