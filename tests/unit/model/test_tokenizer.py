"""The tokenizer against llama.cpp's recorded answers (scripts/record_tokenizer_cases.py).

Each tests/data/tokenizer/<vocab>.json holds llama-tokenize's ids for several hundred edge cases
(text, add_special, parse_special), the bytes llama.cpp gives each token it emitted, and its
end-of-generation ids. The tiny vocabularies are committed GGUFs; Gemma 3 is the real model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraserve.model.gguf import GGUFFile
from loraserve.model.tokenizer import SpecialSplitter, StreamDecoder, Tokenizer

DATA = Path(__file__).resolve().parents[2] / "data" / "tokenizer"
TINY = ["tiny_spm", "tiny_bpe_llama-bpe", "tiny_bpe_qwen2", "tiny_bpe_gpt-2", "tiny_bpe_default"]


def read_metadata(path: Path) -> dict[str, Any]:
    with GGUFFile(path) as f:
        return dict(f.metadata)


def load_record(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture(scope="module", params=TINY)
def tiny(request: pytest.FixtureRequest) -> tuple[Tokenizer, dict[str, Any]]:
    record = load_record(request.param)
    return Tokenizer.from_gguf_metadata(read_metadata(DATA / record["vocab"])), record


@pytest.fixture(scope="module")
def gemma(real_model_path: Path) -> tuple[Tokenizer, dict[str, Any]]:
    return Tokenizer.from_gguf_metadata(read_metadata(real_model_path)), load_record("gemma3")


def check_cases(tok: Tokenizer, record: dict[str, Any]) -> None:
    wrong = []
    for case in record["cases"]:
        got = tok.encode(case["text"], case["add_special"], case["parse_special"])
        if got != case["ids"]:
            wrong.append(
                (case["text"], case["add_special"], case["parse_special"], got, case["ids"])
            )
    assert not wrong, f"{len(wrong)}/{len(record['cases'])} differ from llama.cpp, e.g. {wrong[:3]}"


def check_pieces(tok: Tokenizer, record: dict[str, Any]) -> None:
    pieces = {int(k): bytes.fromhex(v) for k, v in record["pieces"].items()}
    wrong = {i: (tok.token_bytes(i), b) for i, b in pieces.items() if tok.token_bytes(i) != b}
    assert not wrong, f"token_bytes differs from llama.cpp's token_to_piece: {wrong}"
    for case in record["cases"]:
        if all(i in pieces for i in case["ids"]):
            joined = b"".join(pieces[i] for i in case["ids"]).decode(errors="replace")
            assert tok.decode(case["ids"]) == joined


def test_tiny_vocab_encode_matches_llama_cpp(tiny: tuple[Tokenizer, dict[str, Any]]) -> None:
    check_cases(*tiny)


def test_tiny_vocab_pieces_match_llama_cpp(tiny: tuple[Tokenizer, dict[str, Any]]) -> None:
    check_pieces(*tiny)


def test_tiny_vocab_eog_ids(tiny: tuple[Tokenizer, dict[str, Any]]) -> None:
    tok, record = tiny
    assert sorted(tok.eog_ids) == record["eog_ids"]


@pytest.mark.real_model
def test_gemma_encode_matches_llama_cpp(gemma: tuple[Tokenizer, dict[str, Any]]) -> None:
    check_cases(*gemma)


@pytest.mark.real_model
def test_gemma_pieces_and_specials(gemma: tuple[Tokenizer, dict[str, Any]]) -> None:
    tok, record = gemma
    check_pieces(tok, record)
    assert sorted(tok.eog_ids) == record["eog_ids"]
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos) == (262144, 2, 1, True)
    assert tok.token_bytes(236743) == b" " and tok.piece(105) == "<start_of_turn>"
    assert tok.token_bytes(238 + 0xE2) == b"\xe2"


def test_special_split_claims_longest_token_first() -> None:
    splitter = SpecialSplitter({"aaa": 1, "ba": 2, "<x>": 3, "  ": 4, "   ": 5})
    assert splitter.split("baaa") == ["b", 1]
    assert splitter.split("baba<x>") == [2, 2, 3]
    assert splitter.split(" " * 7) == [5, 5, " "]
    assert splitter.split("a<x") == ["a<x"]
    assert splitter.split("") == []


def reference_partition(
    text: str, specials: dict[str, int], lstrip: set[int], rstrip: set[int]
) -> list[str | int]:
    """llama.cpp's tokenizer_st_partition, transcribed directly (slow)."""
    space = " \t\n\v\f\r"
    fragments: list[str | int] = [text] if text else []
    for word in sorted(specials, key=lambda w: (-len(w), specials[w])):
        tid, out = specials[word], []
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
                continue
            start = 0
            while (found := fragment.find(word, start)) >= 0:
                left = fragment[start:found]
                out += [left.rstrip(space) if tid in lstrip else left, tid]
                start = found + len(word)
                while tid in rstrip and start < len(fragment) and fragment[start] in space:
                    start += 1
            out.append(fragment[start:])
        fragments = [f for f in out if f != ""]
    return fragments


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text("ab< ", min_size=1, max_size=4), unique=True, max_size=6),
    st.text("ab< \t", max_size=30),
    st.sets(st.integers(0, 5)),
    st.sets(st.integers(0, 5)),
)
def test_special_split_equals_llama_cpp_partition(
    words: list[str], text: str, lstrip: set[int], rstrip: set[int]
) -> None:
    specials = {w: i for i, w in enumerate(words)}
    expected = reference_partition(text, specials, lstrip, rstrip)
    assert SpecialSplitter(specials, lstrip, rstrip).split(text) == expected


def test_hf_dir_matches_gguf_path(tmp_path: Path) -> None:
    """A tokenizer.json holding the tiny llama-bpe vocabulary tokenizes as llama.cpp did."""
    from tokenizers import AddedToken, decoders

    from loraserve.model.tokenizer_bpe import build_bpe

    record = load_record("tiny_bpe_llama-bpe")
    meta = read_metadata(DATA / record["vocab"])
    hf, _ = build_bpe(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"], "llama-bpe")
    hf.decoder = decoders.ByteLevel()
    texts, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"].tolist()
    hf.add_tokens(
        [AddedToken(t, special=types[i] == 3) for i, t in enumerate(texts) if types[i] > 1]
    )
    hf.save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
              "add_bos_token": True, "chat_template": "{{ messages }}"}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert tok.chat_template == "{{ messages }}"
    assert sorted(tok.eog_ids) == record["eog_ids"]
    check_cases(tok, record)
    check_pieces(tok, record)


@pytest.fixture(scope="module")
def spm_tok() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(read_metadata(DATA / "tiny_spm.gguf"))


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40))
def test_stream_decoder_never_splits_characters(spm_tok: Tokenizer, text: str) -> None:
    ids = spm_tok.encode(text, add_special=False, parse_special=False)
    stream = StreamDecoder(spm_tok)
    chunks = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(chunks) == spm_tok.decode(ids)
    assert "\ufffd" not in "".join(chunks) or "\ufffd" in text


def test_stream_decoder_holds_back_partial_utf8(spm_tok: Tokenizer) -> None:
    byte_ids = [next(i for i in range(spm_tok.vocab_size) if spm_tok.token_bytes(i) == bytes([b]))
                for b in "😀".encode()]  # fmt: skip
    stream = StreamDecoder(spm_tok)
    assert [stream.push(i) for i in byte_ids] == ["", "", "", "😀"]
    assert stream.push(byte_ids[0]) == "" and stream.flush() == "\ufffd"


def test_pieces_wire_is_what_protobuf_reads() -> None:
    """The hand-built `pieces` field parses back, with protobuf itself, to every text, score
    and type, long texts (multi-byte length varints) and non-ASCII ones included."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    from loraserve.model.tokenizer_spm import pieces_wire

    texts = ["<unk>", "a", "▁the", "x" * 200, "é" * 9000, "<0x0A>", ""]
    scores = [0.0, -1.5, 3.25, -1e30, 7.0, 0.0, -0.0]
    kind = pb.ModelProto.SentencePiece
    kinds = np.array([kind.UNKNOWN, kind.NORMAL, kind.NORMAL, kind.NORMAL, kind.NORMAL,
                      kind.BYTE, kind.NORMAL])  # fmt: skip
    proto = pb.ModelProto.FromString(pieces_wire(texts, scores, kinds))
    assert [p.piece for p in proto.pieces] == texts
    assert [p.type for p in proto.pieces] == kinds.tolist()
    assert np.array_equal(
        np.array([p.score for p in proto.pieces], dtype=np.float32),
        np.array(scores, dtype=np.float32),
    )
