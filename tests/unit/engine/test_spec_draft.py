"""`draft-simple`: a draft model proposes under its base weights; answers stay those of
speculation off (greedy and seeded, with adapter mixes, alone and concurrent), and a draft
model whose vocabulary is not the model's is refused at load, in the engine and at server
start, saying how the vocabularies differ."""

from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path

import pytest

import tests.tiny as tiny
from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecConfig
from loraserve.engine.spec.draft_model import VocabMismatch, check_vocab
from loraserve.model.loader import LoadedModel, load_model
from tests.engine_util import ask, tokens
from tests.server_util import serve_in_thread, tiny_model, tiny_model_path
from tests.unit.engine.spec_util import (
    GREEDY,
    MIXES,
    SEEDED,
    adapter_dir,
    answers,
    copy_prompts,
    drafted,
    seeded,
)

DRAFT = SpecConfig(types=("draft-simple",), draft_model="tiny", draft_n_max=4)


@functools.cache
def other_vocab_path() -> Path:
    """The tiny llama with one token's text changed (id 300)."""
    import tempfile

    texts, scores, types = tiny.tiny_vocab()
    texts = [*texts[:300], "▁changed", *texts[301:]]
    folder = Path(tempfile.mkdtemp(prefix="loraserve-vocab-"))
    original = tiny.tiny_vocab
    tiny.tiny_vocab = lambda: (texts, scores, types)
    try:
        return tiny.write_gguf(folder / "other.gguf", tiny.hf_model("llama", seed=7), "llama")
    finally:
        tiny.tiny_vocab = original


@functools.cache
def small_draft() -> LoadedModel:
    """Another (one-layer) model on the same vocabulary: it drafts, often wrongly."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="loraserve-draft-")) / "draft.gguf"
    return load_model(
        tiny.write_gguf(path, tiny.hf_model("llama", seed=9, num_hidden_layers=1), "llama")
    )


def engine(draft: LoadedModel | None, spec: SpecConfig = DRAFT) -> Engine:
    cfg = EngineConfig(n_slots=4, n_ctx=1024, spec=spec)
    eng = Engine(tiny_model(), cfg, draft=draft)
    for name in ("a", "b"):
        eng.load_adapter(adapter_dir() / name, 0.0).result()
    return eng


def todo(sampling: SamplingParams, k: int = 6) -> list[dict]:
    return [
        ask(
            p,
            30,
            MIXES[i % len(MIXES)],
            sampling=sampling if sampling.greedy else seeded(sampling, i),
        )
        for i, p in enumerate(copy_prompts(5, k))
    ]


@pytest.mark.parametrize("concurrent", [False, True], ids=["alone", "concurrent"])
@pytest.mark.parametrize("draft", ["itself", "small"])
def test_greedy_answers_equal_speculation_off(draft: str, concurrent: bool) -> None:
    """The model as its own draft (accepted under the base mix, rejected under adapters) and
    a different small model (mostly rejected)."""
    d = tiny_model() if draft == "itself" else small_draft()
    asks = todo(GREEDY)
    off = answers(engine(None, SpecConfig()), asks, concurrent)
    on = answers(engine(d), asks, concurrent)
    assert [tokens(e) for e in on] == [tokens(e) for e in off]
    n, accepted = drafted(on)
    assert n > 0 and (accepted > 0 if draft == "itself" else accepted < n)
    if draft == "itself":
        assert accepted < n  # the adapter mixes reject what the base weights draft


def test_seeded_answers_equal_speculation_off() -> None:
    asks = todo(SEEDED, 8)
    off = answers(engine(None, SpecConfig()), asks, True)
    on = answers(engine(tiny_model()), asks, True)
    assert [tokens(e) for e in on] == [tokens(e) for e in off]
    assert drafted(on)[1] > 0


def test_long_prompts_are_read_a_chunk_a_step(monkeypatch) -> None:
    import loraserve.engine.spec.draft_model as dm

    monkeypatch.setattr(dm, "MAX_CATCH_UP", 5)
    asks = todo(GREEDY)
    off = answers(engine(None, SpecConfig()), asks, True)
    eng = engine(tiny_model())
    on = answers(eng, asks, True)
    assert [tokens(e) for e in on] == [tokens(e) for e in off]
    assert drafted(on)[1] > 0


def test_p_min_stops_unsure_drafts() -> None:
    asks = todo(GREEDY)
    sure = drafted(
        answers(engine(small_draft(), dataclasses.replace(DRAFT, draft_p_min=0.0)), asks, True)
    )
    unsure = Engine(
        tiny_model(), EngineConfig(n_slots=4, n_ctx=1024, spec=DRAFT), draft=small_draft()
    )
    unsure.core.spec.draft_model.p_min = 1.0  # type: ignore[union-attr]
    for name in ("a", "b"):
        unsure.load_adapter(adapter_dir() / name, 0.0).result()
    assert sure[0] > 0 and drafted(answers(unsure, asks, True)) == (0, 0)


def test_a_mismatched_vocabulary_is_refused() -> None:
    target = tiny_model()
    other = load_model(other_vocab_path())
    with pytest.raises(VocabMismatch, match="token 300"):
        check_vocab(target, other)
    with pytest.raises(VocabMismatch, match="token 300"):
        Engine(target, EngineConfig(spec=DRAFT), draft=other)
    bos = copy.copy(other.tokenizer)
    bos.bos_id = 2
    with pytest.raises(VocabMismatch, match="BOS"):
        check_vocab(target, dataclasses.replace(other, tokenizer=bos))
    check_vocab(target, small_draft())  # same vocabulary, other weights: fine


def test_the_server_refuses_a_mismatched_draft_at_start() -> None:
    args = ["-m", str(tiny_model_path()), "-md", str(other_vocab_path())]
    with pytest.raises(RuntimeError, match="its vocabulary differs .*token 300"):
        with serve_in_thread(args):
            pass


def test_a_missing_or_broken_draft_is_refused_before_anything_loads(tmp_path) -> None:
    from loraserve.server.config.args import parse_server_args
    from loraserve.server.startup import StartupError, check_files

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    for path, needle in ((tmp_path / "none.gguf", "not found"), (bad, "not a GGUF file")):
        cfg = parse_server_args(["-m", str(tiny_model_path()), "-md", str(path)])
        with pytest.raises(StartupError, match=f"draft model: .*{needle}"):
            check_files(cfg)
