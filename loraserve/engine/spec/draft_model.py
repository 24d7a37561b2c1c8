"""`draft-simple`: a small draft model proposes tokens greedily, under its base weights.

The draft model keeps its own KV: one fixed run of blocks per slot (no prefix index), and per
slot the tokens whose KV it holds. A proposal first feeds the sequence's tokens the draft has
not seen (its KV is kept up to the longest common prefix with what it saw last, so a rejected
draft costs nothing to roll back, and a slot's next request reuses the shared prefix), then
decodes greedily one token at a time, every drafting sequence as a row of one forward per
position (a long prompt is read `MAX_CATCH_UP` tokens a step first, without drafting). A
sequence stops drafting at its limit, or once the draft model's probability of
its own choice falls below ``p_min`` (llama.cpp's `--spec-draft-p-min`).

`check_vocab` refuses a draft model whose vocabulary differs from the target's, with the
rules of llama.cpp's `common_speculative_are_compatible` (same tokenizer type and BOS/EOS,
sizes within 128, the same token text from id 5 on).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loraserve.engine.request import Run
from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.model.loader import LoadedModel

VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
BLOCK = 16
MAX_CATCH_UP = 512  # prompt tokens the draft model reads per step before it drafts


class VocabMismatch(ValueError):
    """The draft model's vocabulary is not the target's; the message says where."""


def check_vocab(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise `VocabMismatch` unless ``draft`` can draft for ``target``."""
    t, d = target.tokenizer, draft.tokenizer
    kind_t = target.metadata.get("tokenizer.ggml.model", "hf")
    kind_d = draft.metadata.get("tokenizer.ggml.model", "hf")
    if kind_t != kind_d:
        raise VocabMismatch(f"vocabulary type {kind_d!r} is not the model's {kind_t!r}")
    if t.add_bos != d.add_bos or (t.add_bos and t.bos_id != d.bos_id):
        raise VocabMismatch(
            f"BOS (add {d.add_bos}, id {d.bos_id}) is not the model's "
            f"(add {t.add_bos}, id {t.bos_id})"
        )
    if t.add_eos != d.add_eos or (t.add_eos and t.eos_id != d.eos_id):
        raise VocabMismatch(
            f"EOS (add {d.add_eos}, id {d.eos_id}) is not the model's "
            f"(add {t.add_eos}, id {t.eos_id})"
        )
    if abs(t.vocab_size - d.vocab_size) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise VocabMismatch(
            f"{d.vocab_size} tokens, the model has {t.vocab_size} (at most "
            f"{VOCAB_MAX_SIZE_DIFFERENCE} apart)"
        )
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(t.vocab_size, d.vocab_size)):
        if t.token_bytes(i) != d.token_bytes(i):
            raise VocabMismatch(
                f"token {i} is {d.token_bytes(i)!r}, the model's is {t.token_bytes(i)!r}"
            )


class DraftModel:
    """Greedy drafts from ``model`` for the slots of one engine (`Speculator`'s `DraftFn`)."""

    def __init__(self, model: LoadedModel, n_slots: int, n_ctx_slot: int, p_min: float) -> None:
        if model.config.recurrent:  # its KV is reused from any common prefix: no state there
            raise ValueError(
                f"a draft model with recurrent layers ({model.config.arch}) is not supported"
            )
        self.model = model
        self.p_min = p_min
        self.per_slot = (n_ctx_slot + BLOCK - 1) // BLOCK + 1
        self.runner = ModelRunner(model.decoder, BLOCK, torch.float32)
        self.runner.ensure_capacity(n_slots * self.per_slot)
        self.seen: list[list[int]] = [[] for _ in range(n_slots)]  # tokens with draft KV
        self.vocab = model.tokenizer.vocab_size

    def _blocks(self, slot: int) -> list[int]:
        return list(range(slot * self.per_slot, (slot + 1) * self.per_slot))

    def __call__(self, runs: list[Run], limits: list[int]) -> list[list[int]]:
        """One greedy draft per run, at most its limit (tokens of the target's vocabulary)."""
        out: list[list[int]] = [[] for _ in runs]
        limits = list(limits)
        live = [i for i, n in enumerate(limits) if n > 0]
        seqs = {i: list(runs[i].tokens) for i in live}  # what each run's next row follows
        items = []
        for i in list(live):
            seq, slot = seqs[i], runs[i].slot
            keep = _common_prefix(self.seen[slot], seq, len(seq) - 1)  # draft KV still valid
            if len(seq) - keep > MAX_CATCH_UP:  # a long prompt: its KV first, a chunk a step
                seqs[i] = seq[: keep + MAX_CATCH_UP]
                limits[i] = 0
            items.append(self._item(seqs[i], keep, len(seqs[i]) - keep, slot))
        while live:
            logits = self.runner.forward(items)  # [len(live), V] float32
            p, tok = torch.softmax(logits, dim=-1).max(dim=-1)  # [len(live)] each
            nxt, items = [], []
            for row, i in enumerate(live):
                seq, slot, t = seqs[i], runs[i].slot, int(tok[row])
                self.seen[slot] = list(seq)  # the draft KV now holds all of seq
                if limits[i] == 0 or float(p[row]) < self.p_min or t >= self.vocab:
                    continue
                out[i].append(t)
                seq.append(t)
                if len(out[i]) < limits[i]:
                    nxt.append(i)
                    items.append(self._item(seq, len(seq) - 1, 1, slot))
            live = nxt
        return out

    def _item(self, tokens: Sequence[int], start: int, n: int, slot: int) -> BatchItem:
        return BatchItem(
            tokens=list(tokens), start=start, n=n, blocks=self._blocks(slot),
            want_logits=True, mix={},
        )  # fmt: skip


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if n >= limit or x != y:
            break
        n += 1
    return n
