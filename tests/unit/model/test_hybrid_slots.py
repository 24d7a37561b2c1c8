"""Saved slots and checkpoints of recurrent models (issue 28: slot save/restore carries the
state; ``--ctx-checkpoints`` as llama-server's).

- A slot saved to a file and restored into another engine carries the state at its end and
  its checkpoints, not only the snapshots after its blocks: a next turn resumes at the exact
  position the saved one reached (inside a block), an edited last message at its checkpoint,
  and every answer equals the same request's computed from scratch, bit for bit. Under
  another adapter mix than the one the slot was saved under nothing is resumed.
- ``--ctx-checkpoints N``: a slot keeps at most N checkpoints (0: none, a branch resumes at a
  block boundary), and the flag reaches the engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loraserve.engine import slot_io
from loraserve.engine.core import EngineConfig
from loraserve.engine.engine import Engine
from loraserve.lora.adapter_write import write_gguf_lora
from loraserve.server.config.args import parse_server_args
from tests.engine_util import ask
from tests.unit.model.archs_util import PROBS
from tests.unit.model.recurrent_util import RECORDS, RECURRENT_STEMS, answers, model, stem_adapter

# the hybrids whose decode steps run in the fused C layers (their state records written there)
HYBRIDS = [a for a in ("granitehybrid", "qwen35", "lfm2", "nemotron_h", "mamba2", "falcon-h1")
           if a in RECORDS]  # fmt: skip
TURN = [5, 9, 3, 7, 11, 2, 8, 4, 6, 10]  # with 5 answer tokens fed: 15, inside a block


def _engine(m, adapter: Path, **kw) -> Engine:  # type: ignore[no-untyped-def]
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4, **kw))
    eng.load_adapter(adapter, 0.0).result()
    return eng


def _adapter_file(tmp: Path, arch: str, m) -> Path:  # type: ignore[no-untyped-def]
    p = tmp / f"{arch}-slots.gguf"
    rec = RECORDS[arch]["variants"]["dense"]
    pairs = stem_adapter(rec, 5, RECURRENT_STEMS + ("attn_q", "attn_v", "ffn_up"))
    write_gguf_lora(p, arch, pairs, qk_heads=(m.config.n_heads,) * 2)
    return p


@pytest.mark.parametrize("arch", HYBRIDS)
@pytest.mark.parametrize("mix", [None, {0: 0.5}], ids=["base", "mixed"])
def test_restored_slot_resumes_warm_and_bit_identical(
    tmp_path: Path, arch: str, mix: dict | None
) -> None:
    """Saved after one turn (its end at 15 tokens, a checkpoint 4 tokens before its prompt's
    end), written, read back and restored into a fresh engine: the next turn resumes at 15
    and the edited last message at its checkpoint (6), both inside blocks, with the answers
    of a cache-off engine; the other mix resumes nothing from the file."""
    m = model(tmp_path, arch, "dense")
    adapter = _adapter_file(tmp_path, arch, m)
    first, off = _engine(m, adapter), _engine(m, adapter)
    ((gen, _, _),) = answers(first, [ask(TURN, 6, mix, sampling=PROBS)])
    image = first.save_slot(0).result()
    assert image.live is not None, "the state at the slot's end was not saved"
    assert sorted(image.ckpts) == [len(TURN) - 4]
    fp = slot_io.fingerprint(m)
    slot_io.write(tmp_path / "a.slot", image, fp)
    loaded = slot_io.read(tmp_path / "a.slot", fp, 128)
    assert loaded.live is not None and sorted(loaded.ckpts) == sorted(image.ckpts)
    other = None if mix else {0: 0.5}
    nxt = TURN + gen + [13, 14, 15]
    branch = TURN[:7] + [1, 12, 3]
    for prompt, m2, want_cached in (
        (nxt, mix, len(TURN) + len(gen) - 1),  # all but the last answer token
        (branch, mix, len(TURN) - 4),  # the checkpoint 4 tokens before the prompt's end
        (nxt, other, 0),  # another key: neither the file's blocks nor its states
    ):
        eng = _engine(m, adapter)
        assert eng.restore_slot(0, loaded).result() == len(loaded.tokens)
        ((got, probs, cached),) = answers(eng, [ask(prompt, 4, m2, sampling=PROBS)])
        ((ref, ref_probs, _),) = answers(off, [ask(prompt, 4, m2, sampling=PROBS,
                                                   cache_prompt=False)])  # fmt: skip
        assert (got, probs) == (ref, ref_probs)
        assert cached == want_cached
        eng.core.cache.check()


def test_restored_slot_file_states_are_checked(tmp_path: Path) -> None:
    """A checkpoint or end state of the wrong shape, or a checkpoint past the slot's
    tokens, is refused at restore (`SlotFileError`), the slot left as it was."""
    m = model(tmp_path, "granitehybrid", "dense")
    eng = Engine(m, EngineConfig(n_slots=1, n_ctx=128, block_size=4))
    answers(eng, [ask(TURN, 6)])
    image = eng.save_slot(0).result()
    assert image.live is not None and image.ckpts
    (p, st), n = next(iter(image.ckpts.items())), len(image.tokens)
    cut = {i: t[:1] for i, t in st.items()}
    bad = [
        slot_io.SlotImage(image.tokens, image.cache_key, image.kv, image.states, cut),
        slot_io.SlotImage(
            image.tokens, image.cache_key, image.kv, image.states, image.live, {p: cut}
        ),  # fmt: skip
        slot_io.SlotImage(
            image.tokens, image.cache_key, image.kv, image.states, image.live, {n + 1: st}
        ),  # fmt: skip
    ]
    for b in bad:
        with pytest.raises(slot_io.SlotFileError, match="recurrent"):
            eng.restore_slot(0, b).result()
    assert eng.core.scheduler.slots[0].tokens == image.tokens


@pytest.mark.parametrize("arch", HYBRIDS)
def test_ctx_checkpoints_bounds_a_slots_checkpoints(tmp_path: Path, arch: str) -> None:
    """``--ctx-checkpoints``: three turns of a chat keep 4 checkpoints by default (where each
    prompt continued the last one's state and 4 tokens before each prompt's end), the latest
    2 with 2, none with 0, where an edited last message resumes at a block boundary instead
    of its checkpoint; with 3 and ``--checkpoint-min-step 8`` the second request's (14) goes
    when the list fills (within 8 of 6: llama-server's thinning, `tests/unit/cache/
    test_state_checkpoints.py`); the answers equal cache-off's either way."""
    m = model(tmp_path, arch, "dense")
    adapter = _adapter_file(tmp_path, arch, m)
    off = _engine(m, adapter)
    kept = {}
    for n, cms in ((32, 8192), (2, 8192), (0, 8192), (3, 8)):
        eng = _engine(m, adapter, ctx_checkpoints=n, checkpoint_min_step=cms)
        history = list(TURN)
        for msg in ([13, 14, 15], [16, 17, 18, 19]):
            ((gen, _, _),) = answers(eng, [ask(history, 5)])
            history += gen + msg
        ((gen, _, _),) = answers(eng, [ask(history, 5)])
        states = eng.core.runner.states
        assert states is not None
        kept[n, cms] = sorted(states.live[0].ckpts)
        branch = history[:-4] + [1, 12, 3, 9]  # the last message edited
        ((got, _, cached),) = answers(eng, [ask(branch, 4)])
        ((ref, _, _),) = answers(off, [ask(branch, 4, cache_prompt=False)])
        assert got == ref
        start = len(history) - 4  # the checkpoint 4 tokens before the last prompt's end
        if n:
            assert cached == start
        else:
            assert cached % 4 == 0 and cached < start
    assert kept[32, 8192] == [6, 14, 22, 23]  # 14: the second prompt's start and its tail's
    assert kept[2, 8192] == [22, 23] and kept[0, 8192] == [] and kept[3, 8] == [6, 22, 23]


def test_ctx_checkpoints_flag_reaches_the_server_config() -> None:
    """-ctxcp / --ctx-checkpoints / --swa-checkpoints set it (no longer accepted and
    ignored); llama-server's default is 32."""
    assert parse_server_args(["-m", "x.gguf"]).ctx_checkpoints == 32
    for flag in ("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"):
        cfg = parse_server_args(["-m", "x.gguf", flag, "3"])
        assert cfg.ctx_checkpoints == 3
        assert flag not in getattr(cfg, "ignored", [])
