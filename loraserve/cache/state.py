"""Per-sequence recurrent state beside the KV blocks, and its snapshots at block boundaries.

A recurrent layer (`model/recurrent/`) carries a state from one token to the next instead of
keys that later tokens attend. Its state after a prefix cannot be cut out of KV blocks at any
token, so it is kept in two places:

- the **live** state of each running sequence, keyed by its slot and request id, at the
  position its next step starts from (and the position before its last step, so that a step
  that failure isolation runs again alone starts from the same state), and the slot's
  **checkpoints** at llama-server's positions: where each of its prompts began from the live
  state (an edited last message resumes there) and 4 tokens before each prompt's end (a
  re-rendered template tail), at most ``checkpoints`` a slot (when full, those of earlier
  requests within ``min_step`` tokens of the one kept before them go first, then the oldest:
  llama-server's ``create_checkpoint``, `_add_checkpoint`), used only by a prompt under the
  slot's cache key that starts with the tokens before them (`resume_point`), each costing a
  snapshot's share in the cache budget and evicted first (`drop_checkpoint`);
- a **snapshot** of every layer's state after some full blocks a sequence computed, stored
  under that block's id: after every ``every``-th block of the sequence (``--checkpoint-min-step``
  tokens, in blocks; 1: after each) and after the last full block of each multi-token step
  (a prompt's prefill chunk: so the end of every prompt has one, and the next turn of a chat
  resumes there, as llama-server's checkpoints near the end of each prompt), and after the
  latest full block its decode finished (each such block's snapshot replaces the previous
  one of the same sequence, while that block is still the running sequence's own: so a
  chat's next turn resumes inside the answer, not at the end of the prompt). A snapshot of a
  Granite-4-size model is ~60 MB, so one per block (16 tokens) cost ~15 GB per 4k prompt.
  A block id in the prefix index names (parent chain, adapter block key,
  tokens) exactly, so a snapshot lives under the same cache key as the KV it follows, is freed
  when its block is freed or evicted (`drop`, called by the prefix cache), and its bytes are
  counted in the cache budget with its block: a block costs its KV share of a budget unit
  (KV and snapshot bytes), or the whole unit with a snapshot (`kv_share`).

Invariants: a step reads a state only from the same sequence's live state at exactly its start
position, or from the snapshot of the block that ends exactly there (a prefix-cache hit, whose
match the prefix cache cuts to the latest block at or before the hit that has one, the rest
of the prompt recomputed), or zeros at position 0; anything else is
`StateMissing` (the step fails, never runs on a wrong state). States are committed only after
the whole forward pass returned (`commit`), never half-written by a failed step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loraserve.cache.state_records import LiveState, SeqStep, StateMissing, States


class StateStore:
    """Live states of running sequences and block-boundary snapshots of one model.

    ``shapes``: recurrent layer index -> the shape of its state for one sequence;
    ``checkpoints``: the most checkpoints a slot keeps (llama-server's ``--ctx-checkpoints``);
    ``min_step``: tokens within which a full slot thins earlier requests' checkpoints
    (``--checkpoint-min-step``; also ``every``, in blocks).
    """

    def __init__(
        self,
        shapes: dict[int, tuple[int, ...]],
        block_size: int,
        every: int = 1,
        kv_block_bytes: int = 0,
        checkpoints: int = 32,
        min_step: int = 8192,
    ) -> None:
        if every < 1:
            raise ValueError(f"snapshot interval {every} blocks: must be at least 1")
        if checkpoints < 0 or min_step < 0:
            raise ValueError(f"checkpoints {checkpoints}, min step {min_step}: must be >= 0")
        self.shapes = dict(shapes)
        self.bs = block_size
        self.every = every  # a snapshot after every ``every``-th full block (and step ends)
        self.kv_block_bytes = kv_block_bytes  # one block's KV bytes (the budget's other part)
        self.live: dict[int, LiveState] = {}  # slot -> its sequence's states
        self.snaps: dict[int, States] = {}  # block id -> states after the block's last token
        self.max_ckpts = checkpoints
        self.min_step = min_step
        self._snapshot_bytes = sum(4 * _numel(s) for s in self.shapes.values())

    @property
    def snapshot_bytes(self) -> int:
        """Bytes of one snapshot (every recurrent layer's float32 state)."""
        return self._snapshot_bytes

    @property
    def kv_share(self) -> float:
        """A block without a snapshot in the cache budget, whose unit is one block's KV and
        one snapshot: its KV's share of the unit (a block with one costs the unit)."""
        total = self.kv_block_bytes + self.snapshot_bytes
        return self.kv_block_bytes / total if total else 1.0

    def has(self, block: int) -> bool:
        """Whether a snapshot follows ``block`` (a prefix hit may end there)."""
        return block in self.snaps

    def drop(self, block: int) -> None:
        """Forget the snapshot of ``block`` (freed or evicted with it)."""
        self.snaps.pop(block, None)

    def prepare(
        self, slot: int, seq: int, start: int, n: int, blocks: Sequence[int], lo: int,
        end: int = -1,
    ) -> SeqStep:  # fmt: skip
        """The step of sequence ``seq`` in ``slot``: tokens ``start..start+n-1`` at rows
        ``lo..lo+n-1``, its KV in ``blocks``; `StateMissing` when no exact state exists.
        ``end``: the length of the sequence's tokens (its prompt's, while it prefills)."""
        live = self.live.get(slot)
        if live is not None and live.seq != seq:  # another sequence took the slot: the last
            del self.live[slot]  # one's states and checkpoints are no use to it (nor held
            live = None  # through its first step: up to 2 + `checkpoints` snapshots)
        if start == 0:
            state = {i: torch.zeros(s) for i, s in self.shapes.items()}
        elif live is not None and live.seq == seq and start in live.at:
            state = live.at[start]
        elif start % self.bs == 0 and blocks[start // self.bs - 1] in self.snaps:
            state = self.snaps[blocks[start // self.bs - 1]]
        else:
            raise StateMissing(f"no recurrent state of this sequence at position {start}")
        first = start // self.bs + 1  # the first block boundary after start
        last = (start + n) // self.bs  # the last one within the step
        cuts = [
            (b * self.bs - start - 1, blocks[b - 1])
            for b in range(first, last + 1)
            if b % self.every == 0 or b == last  # the interval; a chunk's or a decode's end
        ]
        # llama-server's checkpoint 4 tokens before a prompt's end (a next prompt that
        # re-renders the tail of this one resumes there): kept as the slot's checkpoint
        # (key -1 - position; `commit`), unless a block's cut is at that row already
        mark = end - 4  # none with --ctx-checkpoints 0
        if (
            n > 1
            and slot >= 0
            and self.max_ckpts > 0
            and start < mark <= start + n - 1
            and all(r != mark - start - 1 for r, _ in cuts)
        ):
            cuts.append((mark - start - 1, -1 - mark))
        end_only = blocks[last - 1] if n > 1 and last >= first and last % self.every else -1
        latest = blocks[last - 1] if n == 1 and last >= first and last % self.every else -1
        return SeqStep(lo, lo + n, state, cuts, end_only=end_only, latest=latest)

    def commit(self, slot: int, seq: int, start: int, step: SeqStep) -> None:
        """Keep a finished step's states: live at its end position (with the states at its
        start, for a rerun), snapshots under their blocks, a prompt's checkpoint (`prepare`)
        among the slot's."""
        marks = []
        for block, states in step.snaps.items():
            if block < 0:  # a checkpoint at position -1 - block (never a draft's: below)
                marks.append((-1 - block, states))
                continue
            if step.every and block == step.end_only:
                continue  # a draft's end may be rejected; a later step recrossing it is a
                # decode (no cut off the interval): its snapshot would stay stale
            self.snaps[block] = states
        if slot < 0:  # a pass outside the engine (tests): no sequence to continue
            return
        live = self.live.get(slot)
        if live is None or live.seq != seq:
            live = self.live[slot] = LiveState(seq, {})
        if step.latest >= 0:  # one decode snapshot off the interval per sequence: the latest
            if live.latest >= 0 and live.latest != step.latest:
                self.snaps.pop(live.latest, None)
            live.latest = step.latest
        live.at = {start: step.state, start + step.hi - step.lo: step.out}
        for pos, states in marks if not step.every else ():  # a draft's may be rejected
            self._add_checkpoint(live, pos, states)
        for r in range(step.hi - step.lo if step.every else 0):
            live.at[start + r + 1] = {i: rows[r] for i, rows in step.rows.items()}

    def adopt(self, slot: int, seq: int, new_seq: int, at: int) -> bool:
        """Hand ``slot``'s live state at position ``at`` of finished sequence ``seq`` (its
        end, or a checkpoint where one of its prompts began) to ``new_seq``, whose prompt
        extends ``seq``'s first ``at`` tokens under the same cache key (the scheduler checks
        both): its first step then starts from that exact state, at any position, not from a
        snapshot at a block boundary. The state there becomes the new sequence's checkpoint
        (with the old ones before it): a later prompt that leaves this one's new tokens (an
        edited last message) resumes there, as from llama-server's checkpoint before a
        prompt's last batch. False (nothing changed) where the slot holds no state of ``seq``
        at ``at``."""
        live = self.live.get(slot)
        state = None if live is None or live.seq != seq else live.at.get(at, live.ckpts.get(at))
        if live is None or state is None:
            return False
        ckpts = {p: s for p, s in live.ckpts.items() if p < at}
        owners = {p: live.owners.get(p, -1) for p in ckpts}
        # the old sequence's latest decode snapshot stays in the cache (as for a new one)
        new = self.live[slot] = LiveState(new_seq, {at: state}, ckpts=ckpts, owners=owners)
        self._add_checkpoint(new, at, state)
        return True

    def _add_checkpoint(self, live: LiveState, pos: int, states: States) -> None:
        """Keep ``states`` at ``pos`` as a checkpoint of ``live``'s request, as llama-server's
        ``create_checkpoint`` does: while the slot is full (one short of ``checkpoints`` or
        more), earlier requests' checkpoints at most ``min_step`` tokens past the one kept
        before them go, oldest first (so a long chat keeps spread-out ones, not only its
        latest turns), then the oldest while still full; one at the same position is
        replaced."""
        if self.max_ckpts <= 0:
            return
        ckpts, owners = live.ckpts, live.owners
        last = -1
        for p in sorted(ckpts):
            if len(ckpts) + 1 < self.max_ckpts:  # room enough: no more go
                break
            if owners.get(p, -1) != live.seq and last >= 0 and p <= last + self.min_step:
                del ckpts[p]
                owners.pop(p, None)
            else:
                last = p
        while len(ckpts) >= self.max_ckpts:
            p = min(ckpts)
            del ckpts[p]
            owners.pop(p, None)
        ckpts.pop(pos, None)
        ckpts[pos], owners[pos] = states, live.seq

    def resume_point(self, slot: int, seq: int, prompt: Sequence[int], tokens: Sequence[int],
                     lo: int, hi: int) -> int:  # fmt: skip
        """The furthest position p (0 < p, lo <= p <= hi) at which ``slot``'s live sequence
        ``seq`` (whose tokens are ``tokens``) holds a state (its end or a checkpoint) and
        ``prompt`` starts with its first p tokens; -1 where there is none."""
        live = self.live.get(slot)
        if live is None or live.seq != seq:
            return -1
        same, top = 0, min(hi, len(prompt), len(tokens))
        while same < top and prompt[same] == tokens[same]:
            same += 1
        ends = [len(tokens)] if len(tokens) in live.at else []  # where it stopped
        # p == lo too: the slot's state is as exact as the cache's snapshot there, and
        # continuing the slot's sequence keeps its checkpoints (a new one starts without)
        ok = [p for p in (*ends, *live.ckpts) if 0 < p and lo <= p <= same]
        return max(ok, default=-1)

    def seat(self, slot: int, seq: int, at: int, state: States, ckpts: dict[int, States]) -> None:
        """``slot`` holds sequence ``seq`` (a restored slot's: `engine/slot_states.py`) with
        ``state`` after its first ``at`` tokens and its checkpoints ``ckpts`` (position ->
        states; the latest ``checkpoints`` kept), as if that sequence had just run there."""
        kept = sorted(ckpts.items())[-self.max_ckpts :] if self.max_ckpts > 0 else []
        self.live[slot] = LiveState(seq, {at: state}, ckpts=dict(kept))

    @property
    def n_checkpoints(self) -> int:
        """The checkpoints the slots keep (each costs one snapshot in the cache budget)."""
        return sum(len(v.ckpts) for v in self.live.values())

    def drop_checkpoint(self) -> None:
        """Forget the oldest checkpoint of the slot that keeps the most (the budget's first
        eviction: a lost checkpoint costs a branch some recomputed tokens, a lost block more)."""
        live = max(self.live.values(), key=lambda v: len(v.ckpts), default=None)
        if live is not None and live.ckpts:
            p = min(live.ckpts)
            del live.ckpts[p]
            live.owners.pop(p, None)

    def forget(self, slot: int) -> None:
        """Drop the live states of ``slot``'s sequence."""
        self.live.pop(slot, None)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
