"""Recurrent state snapshots, live states and checkpoints (issue 28): the snapshot interval
(``-cms/--checkpoint-min-step``, `EngineConfig.checkpoint_min_step`: snapshots only every N
blocks and at the end of each prompt chunk, a prefix hit resuming from the latest one at or
before it, the rest recomputed), a snapshot at a step's end being the live state itself, a
chat's next turn continuing the slot's live state, an edited last message or a re-rendered
tail resuming from the slot's checkpoints; every answer bit-identical to its cache-off answer.
The hypothesis property over all of it: test_hybrid_property.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraserve.engine import slot_io
from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.lora.adapter_write import write_gguf_lora
from tests.engine_util import ask
from tests.unit.model.archs_util import PROBS
from tests.unit.model.recurrent_util import RECORDS, RECURRENT_STEMS, answers, model, stem_adapter

ARCHS = [a for a in ("jamba", "falcon-h1", "nemotron_h") if a in RECORDS]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("snapshots")


@pytest.mark.parametrize("arch", ARCHS)
def test_interval_keeps_prompt_end_and_resumes_exactly(tmp: Path, arch: str) -> None:
    """A 41-token prompt in 4-token blocks: one snapshot per block with ``-cms 0``, only the
    prompt's last full block (40) with the default; the next turn resumes there either way,
    bit-identical to computing it from scratch."""
    m = model(tmp, arch, "dense")
    prompt = [(7 * i + 3) % 128 for i in range(41)]
    longer = prompt + [5, 9, 14, 2, 77]
    ref = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    (want,) = answers(ref, [ask(longer, 3, sampling=PROBS, cache_prompt=False)])
    counts = {}
    for cms in (0, 8192):
        eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4, checkpoint_min_step=cms))
        answers(eng, [ask(prompt, 3, sampling=PROBS)])
        states = eng.core.runner.states
        assert states is not None
        counts[cms] = len(states.snaps)
        (got,) = answers(eng, [ask(longer, 3, sampling=PROBS)])
        assert got[2] == 40, "the next turn did not resume at the prompt's last full block"
        assert got[:2] == want[:2]
    assert counts[0] >= 10 and counts[8192] == 1


@pytest.mark.parametrize("arch", [a for a in ("granitehybrid", "qwen35") if a in RECORDS])
def test_snapshot_at_a_step_end_is_the_live_state(tmp_path: Path, arch: str) -> None:
    """A prompt ending on a block boundary: the snapshot after that block is the sequence's
    new live state itself (one tensor per layer, never changed in place), not a copy of it:
    a Mamba-2 / delta-net layer's state is 1.5-2.1 MiB at the bench shapes."""
    m = model(tmp_path, arch, "dense")
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=64, block_size=4))
    eng.submit(**ask([5, 9, 3, 7, 11, 2, 8, 4], 1))
    eng.run_until_idle()
    states = eng.core.runner.states
    assert states is not None
    (live,) = states.live.values()
    end = live.at[8]
    shared = [s for s in states.snaps.values() if any(s[i] is end[i] for i in s)]
    assert shared, "no snapshot shares the live state"
    assert all(shared[0][i] is end[i] for i in end)


@pytest.mark.parametrize("arch", [a for a in ("granitehybrid", "qwen35") if a in RECORDS])
def test_next_turn_resumes_from_the_live_state(tmp_path: Path, arch: str) -> None:
    """A chat's next turn (the last prompt, its answer, a new message) resumes from the slot's
    live state at the exact position its last sequence reached, inside a block: only the new
    message and the last answer token are computed (llama-server's 38 of 77 per turn), and
    the answers equal the cache-off ones. Under another adapter mix (another cache key) the
    slot's state is not used."""
    m = model(tmp_path, arch, "dense")
    rec = RECORDS[arch]["variants"]["dense"]
    p = tmp_path / f"{arch}-live.gguf"
    pairs = stem_adapter(rec, 3, RECURRENT_STEMS + ("attn_q", "attn_v", "ffn_up"))
    write_gguf_lora(p, arch, pairs, qk_heads=(m.config.n_heads,) * 2)
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    off = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    for e in (eng, off):
        e.load_adapter(p, 0.0).result()
    turn = [5, 9, 3, 7, 11, 2, 8, 4, 6, 10]  # with 5 answer tokens fed: 15, inside a block
    for mix in (None, {0: 0.5}):
        ((gen, _, _),) = answers(eng, [ask(turn, 6, mix)])
        nxt = turn + gen + [13, 14, 15]
        ((again, _, cached),) = answers(eng, [ask(nxt, 4, mix)])
        ((ref, _, _),) = answers(off, [ask(nxt, 4, mix, cache_prompt=False)])
        assert again == ref
        assert cached == len(turn) + len(gen) - 1  # all but the last answer token
    # the slot now holds the mixed sequence: a base-model request extending it starts over
    # from a snapshot at a block boundary (another cache key), never from that state
    ((gen2, _, _),) = answers(eng, [ask(nxt, 4, {0: 0.5})])
    ((base, _, cached),) = answers(eng, [ask(nxt + gen2 + [16], 2)])
    ((ref, _, _),) = answers(off, [ask(nxt + gen2 + [16], 2, cache_prompt=False)])
    assert base == ref and cached % 4 == 0


def test_restored_slot_never_continues_another_sequences_state(tmp_path: Path) -> None:
    """A slot restored from a file retains that file's tokens and states, not the live state
    of the sequence that ran in it since: a prompt extending the restored tokens resumes
    from the file's own state at its end (`engine/slot_states.py`), or, from a file without
    one, from a snapshot at a block boundary, even where the live state of the sequence that
    ran since sits at the same position."""
    m = model(tmp_path, "qwen35", "dense")
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    off = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    a, b = [5, 9, 3, 7, 11, 2, 8, 4, 6, 10], [12, 4, 9, 9, 3, 5, 7, 2, 8, 6]
    ((gen_a, _, _),) = answers(eng, [ask(a, 6)])
    image = eng.save_slot(0).result()
    bare = slot_io.SlotImage(image.tokens, image.cache_key, image.kv, image.states)
    nxt = a + gen_a + [13, 14, 15]
    ((ref, _, _),) = answers(off, [ask(nxt, 4, cache_prompt=False)])
    for img, at_end in ((image, True), (bare, False)):
        answers(eng, [ask(b, 6)])  # its live state: 15 tokens in, as a's was
        eng.restore_slot(0, img).result()
        ((got, _, cached),) = answers(eng, [ask(nxt, 4)])
        assert got == ref
        assert cached == 15 if at_end else cached % 4 == 0


@pytest.mark.parametrize("arch", [a for a in ("granitehybrid", "qwen35") if a in RECORDS])
def test_edited_last_message_resumes_from_its_checkpoint(tmp_path: Path, arch: str) -> None:
    """A chat whose last user message is edited (a branch) resumes from the checkpoint where
    that message's prompt began (llama-server's checkpoint before a prompt's last batch),
    inside a block: only the edited message is computed, the answers equal the cache-off
    ones. Under another adapter mix the checkpoint is not used; with a cache budget of
    nothing the checkpoint is evicted and the branch resumes at a block boundary."""
    m = model(tmp_path, arch, "dense")
    rec = RECORDS[arch]["variants"]["dense"]
    p = tmp_path / f"{arch}-branch.gguf"
    pairs = stem_adapter(rec, 4, RECURRENT_STEMS + ("attn_q", "attn_v", "ffn_up"))
    write_gguf_lora(p, arch, pairs, qk_heads=(m.config.n_heads,) * 2)
    off = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    off.load_adapter(p, 0.0).result()
    first = [5, 9, 3, 7, 11, 2, 8, 4, 6, 10]
    for ram, mix in ((8.0, None), (8.0, {0: 0.5}), (0.0, None)):
        eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4, cache_ram_mib=ram))
        eng.load_adapter(p, 0.0).result()
        ((gen, _, _),) = answers(eng, [ask(first, 5, mix)])
        history = first + gen  # 15 tokens: the next prompt begins inside a block
        answers(eng, [ask(history + [13, 14, 15], 4, mix)])
        branch = history + [12, 3, 9, 1]  # the last message edited
        other = None if mix else {0: 0.5}
        for m2 in (mix, other) if ram else (mix,):
            ((got, _, cached),) = answers(eng, [ask(branch, 4, m2)])
            ((ref, _, _),) = answers(off, [ask(branch, 4, m2, cache_prompt=False)])
            assert got == ref
            if m2 == mix and ram:
                assert cached == len(history) - 1, "not resumed at the message's checkpoint"
            else:  # another key, or no budget for checkpoints: a block boundary at most
                assert cached % 4 == 0
        eng.core.cache.check()


@pytest.mark.parametrize("arch", [a for a in ("granitehybrid", "qwen35") if a in RECORDS])
def test_prompt_tail_checkpoint(tmp_path: Path, arch: str) -> None:
    """A prompt that leaves the last one within its final 4 tokens (a chat template's tail
    rendered anew) resumes from the checkpoint 4 tokens before that prompt's end, as
    llama-server's, past the last block boundary; answers equal the cache-off ones."""
    m = model(tmp_path, arch, "dense")
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=16))
    off = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=16))
    first = [(i * 7) % 13 + 2 for i in range(30)]
    answers(eng, [ask(first, 3)])
    nxt = first[:27] + [5, 9, 2, 11]
    ((got, _, cached),) = answers(eng, [ask(nxt, 4)])
    ((ref, _, _),) = answers(off, [ask(nxt, 4, cache_prompt=False)])
    assert got == ref
    assert cached == 26, "not resumed at the checkpoint 4 tokens before the prompt's end"


def test_checkpoints_kept_where_the_cache_reaches_the_live_end(tmp_path: Path) -> None:
    """A next turn whose live state sits on a block boundary the cache has a snapshot of
    still continues the slot's sequence: its checkpoints (the last prompt's, 4 tokens before
    its end) stay, where starting over from the snapshot would drop them."""
    m = model(tmp_path, "granitehybrid", "dense")
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    off = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    first = [5, 9, 3, 7, 11, 2, 8, 4, 6, 10, 12, 3, 5]  # 13, and 3 answer tokens fed: 16
    ((gen, _, _),) = answers(eng, [ask(first, 4)])
    nxt = first + gen + [13, 14]
    ((got, _, cached),) = answers(eng, [ask(nxt, 2)])
    ((ref, _, _),) = answers(off, [ask(nxt, 2, cache_prompt=False)])
    assert got == ref and cached == 16
    assert sorted(eng.core.runner.states.live[0].ckpts) == [9, 16]
