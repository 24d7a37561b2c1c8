"""Tiny vocabularies for the tokenizer oracle (used by scripts/record_tokenizer_cases.py).

Each BPE vocabulary is trained here with `tokenizers` on a fixed corpus, pre-split by the regexes
of its `tokenizer.ggml.pre` so that its merges reach the pieces that pre-tokenizer makes, plus a
few whole-word tokens no merge builds (so `ignore_merges` shows). It is written with loraserve's
own GGUF writer as a vocab-only GGUF (committed as test data) and, for llama-server to start, as
a tiny random llama-architecture model carrying the same vocabulary (never committed).
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from loraserve.model.gguf import GGUFFile
from loraserve.model.gguf_write import write_gguf

SPM_USER_DEFINED = ["<tool_call>", "</tool_call>", "\n\n", "\t\t", "<br>", "<<", ">>", "<b>"]
SPM_CONTROL = ["<|im_start|>", "<|im_end|>", "<mask>", "<end_of_turn>"]
BPE_CONTROL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
BPE_USER_DEFINED = ["<think>", "</think>", "  \n"]


WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no "
    "will more what up out about who can said them some could into time only other new "
    "tokenizer server model adapter cache request token batch prompt stream python llama "
    "gemma hello world I'm you're we've they'll she'd it's don't can't won't isn't"
).split()
FOREIGN = [
    "Привет мир", "Grüße aus Köln", "naïve café", "你好，世界", "こんにちは世界", "안녕하세요",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Γειά σου Κόσμε", "ǅemal",
]  # fmt: skip


def training_text() -> str:
    """A deterministic corpus to train the tiny vocabularies on."""
    rng = random.Random(1234)
    lines = []
    for _ in range(3000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 10 ** rng.randint(1, 6))))
        if rng.random() < 0.15:
            words.append(rng.choice(FOREIGN))
        sep = rng.choice([" ", " ", " ", "  ", "\t"])
        lines.append(sep.join(words) + rng.choice([".", ",", "!", "?", ":", ""]))
    lines += ["def f(x):\n    return x ** 2", "for (int i = 0; i < n; ++i) {\n\tfoo();\n}"] * 20
    return "\n".join(lines)


def build_tiny_spm(path: Path) -> None:
    """Train a small SentencePiece BPE model and write it as a vocab-only 'llama' GGUF."""
    import gguf
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text().splitlines()),
        model_writer=model,
        model_type="bpe",
        vocab_size=900,
        byte_fallback=True,
        character_coverage=0.995,
        user_defined_symbols=SPM_USER_DEFINED,
        control_symbols=SPM_CONTROL,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        split_digits=False,
        minloglevel=2,
    )
    proto = pb.ModelProto()
    proto.ParseFromString(model.getvalue())
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny-spm")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([p.piece for p in proto.pieces])
    writer.add_token_scores([p.score for p in proto.pieces])
    writer.add_token_types([int(p.type) for p in proto.pieces])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    _close(writer)


def build_tiny_bpe(path: Path, pre: str) -> None:
    """Train a small byte-level BPE with `tokenizers`; write it as a vocab-only 'gpt2' GGUF."""
    import gguf
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=BPE_CONTROL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text().splitlines(), trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])] + BPE_USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    types = [3 if t in BPE_CONTROL else 4 if t in BPE_USER_DEFINED else 1 for t in tokens]
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name(f"tiny-bpe-{pre}")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|begin_of_text|>"))
    writer.add_eos_token_id(tokens.index("<|end_of_text|>"))
    if pre == "qwen2":
        writer.add_add_bos_token(False)
    _close(writer)


def _close(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


# For the pre-tokenizers recorded with llama-server: code points new in Unicode 16 (llama.cpp
# gives them no category), non-ASCII spaces, digit runs, letter case and marks.
EXTRA_FIXED = [
    "a\u1c89b", "x\u0897y \u0897", "\U0001cc00\U0001cc01 z", "\ua7cbA\ua7dc", "\U000105c0abc",
    "1\U00010d401", "\u2427\u2428!", "\u0378\u0379", "word\u00a0word", "\u00a0\u00a0x",
    "日本\u3000語", "\u3000。", "、\u3000「", "a\u2009b\u202fc", "\u205f\u3000 \t",
    "１２３４５", "12345678", "1,234,567.89", "٣٤٥٦٧", "x1y22z333w4444", "HelloWorld",
    "camelCaseWord", "ALLCAPS words", "MiXeD CaSe", "Don't DON'T don'T I'M i'm",
    "ǅungla ǈ", "naïve e\u0301 a\u0308",
    "\u0915\u094d\u0937", "ก\u0e33", "東京は日本の首都です。", "한국어 문장", "ひらがな カタカナ",
    "（全角）「括弧」！？", "a/b//c /d", "x->y => z", "</think>\n\n", "<sentinel:12>", "IMGIMGABZ",
    "    code\n\tmore", "  two", "\n\n\n  \n", "end   ", "1.5e-10", "$5 & 10%", "¿Qué? ¡Sí!",
]  # fmt: skip
# words made single tokens by merges added after training: pieces llama.cpp's split keeps apart
# (or together) where a plain regex over the real text would not, so the ids show the split
FORCED = ["\u3000。", "、\u3000", "\u3000「", "a\u2009", "\u2009b", "\u00a0word", "\u205f\u3000"]
# whole words as tokens that no merge makes (byte-level text: "Ġ" is a space)
ORPHANS = ["Ġtokenizer", "adapter", "Ġthe", "ĠHello", "123", "Ġ12", "hello", "ä½łå¥½", "ĠDON"]


def training_lines() -> list[str]:
    """The corpus the tiny vocabularies are trained on (the original one plus scripts and
    number formats the newer pre-tokenizers treat apart)."""
    extra = [
        "東京は日本の首都です。ひらがな カタカナ 漢字 한국어 문장입니다",
        "1,234,567.89 12345 2024-01-31 3.14159 ١٢٣ ১২৩",
        "HelloWorld camelCase ALLCAPS Don't DON'T i'm I'M we'LL",
        "naïve café e\u0301 ǅungla Ǆ ǈ ﬁne Ωmega Kelvin",
        "（全角）「括弧」！？。、",
        "def foo(bar): return bar/2 // comment /* c */ a->b",
    ]
    return training_text().splitlines() + extra * 30 + EXTRA_FIXED * 200


def train_bpe(pre: str, vocab_size: int = 1200) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a byte-level BPE trained under `pre`'s regexes."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from loraserve.model.tokenizer_pretok import PRE_TYPES
    from loraserve.model.tokenizer_pretok_custom import CUSTOM_STEPS
    from loraserve.model.tokenizer_regex import RegexSplitter

    tok = Tokenizer(models.BPE())
    # training needs no exact split: llama.cpp's hand-written steps are left out (Kimi K2's
    # whole split stands in as gpt-4o's)
    regexes = [r for r in PRE_TYPES[pre].regexes if r not in CUSTOM_STEPS]
    split = RegexSplitter(regexes or PRE_TYPES["gpt-4o"].regexes).split
    tok.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(False, False)])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BPE_CONTROL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_lines(), trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    byte_level = pre_tokenizers.ByteLevel(False, False)
    for word in FORCED:  # merge each forced word into one token, left to right
        parts = [t for w in byte_level.pre_tokenize_str(word) for t in tok.model.tokenize(w[0])]
        pieces = [p.value for p in parts]
        while len(pieces) > 1:
            joined = pieces[0] + pieces[1]
            merges.append(f"{pieces[0]} {pieces[1]}")
            if joined not in tokens:
                tokens.append(joined)
            pieces[:2] = [joined]
    tokens += [t for t in ORPHANS if t not in tokens] + BPE_USER_DEFINED
    types = [3 if t in BPE_CONTROL else 4 if t in BPE_USER_DEFINED else 1 for t in tokens]
    return tokens, types, merges


def bpe_vocab_metadata(pre: str) -> dict[str, Any]:
    """GGUF metadata of a vocab-only 'gpt2' file for `pre`."""
    tokens, types, merges = train_bpe(pre)
    return {
        "general.architecture": "llama",
        "general.name": f"tiny-bpe-{pre}",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": np.uint32(tokens.index("<|begin_of_text|>")),
        "tokenizer.ggml.eos_token_id": np.uint32(tokens.index("<|end_of_text|>")),
    }


def vocab_metadata(path: Path) -> dict[str, Any]:
    """The `general.*` and `tokenizer.*` metadata of a GGUF, with types kept for rewriting."""
    with GGUFFile(path) as f:
        meta = dict(f.metadata)
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if not key.startswith(("general.", "tokenizer.")):
            continue
        if key.endswith("_token_id"):
            value = np.uint32(value)
        elif isinstance(value, np.ndarray):
            value = value if value.dtype != object else value.tolist()
        out[key] = value
    return out


def write_tiny_model(path: Path, vocab: dict[str, Any], seed: int = 0) -> Path:
    """A 1-layer random llama model (64 wide) carrying `vocab`, for llama-server to load."""
    rng = np.random.default_rng(seed)
    n_vocab, d, ff = len(vocab["tokenizer.ggml.tokens"]), 64, 128
    meta = {
        **vocab,
        "general.architecture": "llama",
        "llama.context_length": np.uint32(1024),
        "llama.embedding_length": np.uint32(d),
        "llama.block_count": np.uint32(1),
        "llama.feed_forward_length": np.uint32(ff),
        "llama.attention.head_count": np.uint32(2),
        "llama.attention.head_count_kv": np.uint32(2),
        "llama.attention.layer_norm_rms_epsilon": np.float32(1e-5),
        "llama.rope.dimension_count": np.uint32(d // 2),
    }

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {
        "token_embd.weight": w(n_vocab, d),
        "output_norm.weight": np.ones(d, np.float32),
        "output.weight": w(n_vocab, d),
        "blk.0.attn_norm.weight": np.ones(d, np.float32),
        "blk.0.attn_q.weight": w(d, d),
        "blk.0.attn_k.weight": w(d, d),
        "blk.0.attn_v.weight": w(d, d),
        "blk.0.attn_output.weight": w(d, d),
        "blk.0.ffn_norm.weight": np.ones(d, np.float32),
        "blk.0.ffn_gate.weight": w(ff, d),
        "blk.0.ffn_up.weight": w(ff, d),
        "blk.0.ffn_down.weight": w(d, ff),
    }
    return write_gguf(path, meta, tensors)
