"""A slot's recurrent-state checkpoints kept as llama-server keeps them (issue 28).

llama-server's ``create_checkpoint`` (tools/server/server-context.cpp): when a slot's list is
full (one short of ``--ctx-checkpoints`` or more), checkpoints of earlier requests at most
``--checkpoint-min-step`` tokens past the one kept before them are erased, oldest first, until
it is not, then the oldest while still full; one at the same position is superseded. The
expected lists below were worked out by hand from that code for the positions our turns make
checkpoints at (where a turn continues the slot's state, and 4 tokens before each prompt's
end).
"""

from __future__ import annotations

import pytest
import torch

from loraserve.cache.state import StateStore

BS = 256  # no block boundary inside the turns: checkpoints only


def _turn(store: StateStore, seq: int, start: int, end: int) -> None:
    """Request ``seq`` in slot 0: continues request ``seq - 1``'s state at ``start`` (its
    end) and computes its prompt up to ``end`` in one chunk."""
    if start:
        assert store.adopt(0, seq - 1, seq, start)
    step = store.prepare(0, seq, start, end - start, [seq], 0, end)
    step.out = {0: torch.tensor([float(end)])}
    step.snaps = {b: {0: torch.tensor([float(start + r + 1)])} for r, b in step.cuts}
    store.commit(0, seq, start, step)


def _kept(store: StateStore) -> list[int]:
    ckpts = store.live[0].ckpts
    assert all(float(s[0][0]) == p for p, s in ckpts.items()), "a checkpoint moved"
    return sorted(ckpts)


TURNS = [(0, 20), (20, 30), (30, 60), (60, 70), (70, 75)]  # (start, prompt end)


@pytest.mark.parametrize(
    ("n", "step", "want"),
    [
        # 3rd: 20, 26 (request 2's) within 10 of 16 go; 5th: 60, 66 within 10 of 56 go
        (4, 10, [[16], [16, 20, 26], [16, 30, 56], [30, 56, 60, 66], [30, 56, 70, 71]]),
        # 3rd: 20 goes, then the list has room: 26 stays (until the 4th's start needs room)
        (5, 10, [[16], [16, 20, 26], [16, 26, 30, 56], [16, 30, 56, 60, 66], [16, 30, 56, 70, 71]]),
        (4, 0, [[16], [16, 20, 26], [20, 26, 30, 56], [30, 56, 60, 66], [60, 66, 70, 71]]),
        (4, 8192, [[16], [16, 20, 26], [16, 30, 56], [16, 60, 66], [16, 70, 71]]),  # default
        (2, 10, [[16], [20, 26], [30, 56], [60, 66], [70, 71]]),
        (0, 10, [[], [], [], [], []]),  # --ctx-checkpoints 0: none
    ],
)
def test_a_chats_checkpoints_are_thinned_as_llama_servers(
    n: int, step: int, want: list[list[int]]
) -> None:
    """Five turns of a chat (each continuing the last one's end), ``--ctx-checkpoints n
    --checkpoint-min-step step``: after each turn the slot keeps llama-server's positions."""
    store = StateStore({0: (1,)}, BS, checkpoints=n, min_step=step)
    got = []
    for seq, (start, end) in enumerate(TURNS, 1):
        _turn(store, seq, start, end)
        got.append(_kept(store))
    assert got == want


def test_a_requests_own_checkpoints_are_not_thinned() -> None:
    """Checkpoints the running request made stay however close (only the oldest go when
    full), and a restored slot's (`seat`: no request made them here) are thinned."""
    store = StateStore({0: (1,)}, BS, checkpoints=3, min_step=100)
    _turn(store, 1, 0, 20)
    _turn(store, 2, 20, 30)  # 20 (its start) and 26, both request 2's, 16 request 1's
    assert _kept(store) == [16, 20, 26]
    st = {p: {0: torch.tensor([float(p)])} for p in (5, 9, 12)}
    store.seat(0, 7, 12, st[12], st)
    _turn(store, 8, 12, 40)  # at 12 (the restored one's state): 9 within 100 of 5 goes
    assert _kept(store) == [5, 12, 36]


def test_bad_checkpoint_settings_are_refused() -> None:
    for kw in ({"checkpoints": -1}, {"min_step": -1}):
        with pytest.raises(ValueError, match="must be >= 0"):
            StateStore({0: (1,)}, BS, **kw)  # type: ignore[arg-type]
