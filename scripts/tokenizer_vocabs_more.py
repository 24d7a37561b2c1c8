"""The UGM, RWKV and SentencePiece-BPE tiny vocabularies of the tokenizer oracle."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
from tokenizer_vocabs import BPE_CONTROL, SPM_CONTROL, SPM_USER_DEFINED, train_bpe, training_lines

# UGM ('t5') vocabularies: (name, add_space_prefix, remove_extra_whitespaces)
UGM_VARIANTS = [("t5", True, True), ("ugm_keep_spaces", False, False), ("ugm_prefix", True, False)]


def ugm_vocab_metadata(name: str, space_prefix: bool, merge_spaces: bool) -> dict[str, Any]:
    """GGUF metadata of a vocab-only 't5' (unigram) file: a SentencePiece unigram model trained
    here with the nmt_nfkc normalization (its precompiled character map goes in the GGUF)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines()),
        model_writer=model,
        model_type="unigram",
        vocab_size=600,
        character_coverage=0.995,
        normalization_rule_name="nmt_nfkc",
        user_defined_symbols=SPM_USER_DEFINED,
        control_symbols=SPM_CONTROL,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        remove_extra_whitespaces=merge_spaces,
        allow_whitespace_only_pieces=True,
        minloglevel=2,
    )
    proto = pb.ModelProto()
    proto.ParseFromString(model.getvalue())
    charsmap = proto.normalizer_spec.precompiled_charsmap
    return {
        "general.architecture": "llama",
        "general.name": f"tiny-{name}",
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": [p.piece for p in proto.pieces],
        "tokenizer.ggml.scores": np.array([p.score for p in proto.pieces], np.float32),
        "tokenizer.ggml.token_type": np.array([int(p.type) for p in proto.pieces], np.int32),
        "tokenizer.ggml.precompiled_charsmap": np.frombuffer(charsmap, np.uint8),
        "tokenizer.ggml.add_space_prefix": space_prefix,
        "tokenizer.ggml.remove_extra_whitespaces": merge_spaces,
        "tokenizer.ggml.eos_token_id": np.uint32(1),
        "tokenizer.ggml.unknown_token_id": np.uint32(2),
        "tokenizer.ggml.padding_token_id": np.uint32(0),
    }


def rwkv_vocab_metadata() -> dict[str, Any]:
    """GGUF metadata of a vocab-only 'rwkv' file laid out as convert_hf_to_gguf.py's world
    vocabulary: '<s>' (CONTROL, BOS), every single byte, then the multi-byte tokens of a byte-level
    BPE trained here (their bytes), each written as Python writes a bytes literal's inside, and
    "[PAD<i>]" (UNUSED) up to a round size; "\\n\\n" is the EOT token."""
    from loraserve.model.tokenizer_bpe import byte_level_decode

    trained, _, _ = train_bpe("gpt-2", vocab_size=1500)
    pieces = [bytes([b]) for b in range(256)]
    seen = set(pieces)
    for text in trained:
        if text in BPE_CONTROL:
            continue
        data = byte_level_decode(text)
        if len(data) > 1 and data not in seen and b"[UNK_BYTE" not in data:
            pieces.append(data)
            seen.add(data)
    for extra in (b"\n\n", b"\\", b"'\"", b"\\x41", b"\xff\xfe", b"it's", b'"quoted"'):
        if extra not in seen:
            pieces.append(extra)
            seen.add(extra)
    tokens = ["<s>"] + [repr(p)[2:-1] for p in pieces]
    types = [3] + [1] * len(pieces)
    while len(tokens) % 64:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)
    return {
        "general.architecture": "llama",
        "general.name": "tiny-rwkv-world",
        "tokenizer.ggml.model": "rwkv",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.bos_token_id": np.uint32(0),
        "tokenizer.ggml.eot_token_id": np.uint32(1 + pieces.index(b"\n\n")),
    }


SPM_BPE_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
SPM_BPE_USER_DEFINED = ["<think>", "</think>"]


def spm_bpe_vocab_metadata(pre: str) -> dict[str, Any]:
    """GGUF metadata of an SPM-style BPE vocabulary (Gemma 4's kind): a BPE over UTF-8
    characters with spaces as U+2581, trained here, then the 256 `<0xXX>` byte tokens (BYTE)
    and newline runs as tokens no merge makes; GGUF model 'gemma4' for pre 'gemma4', else
    'gpt2' with `pre`."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), "isolated")
    trainer = trainers.BpeTrainer(
        vocab_size=1100,
        special_tokens=SPM_BPE_CONTROL,
        limit_alphabet=300,
        show_progress=False,
    )
    tok.train_from_iterator(training_lines(), trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    types = [3 if t in SPM_BPE_CONTROL else 1 for t in tokens]
    extras = ["\n" * k for k in (1, 2, 3, 4, 5, 8)] + ["\u2581\u2581", "\u2581" * 4]
    for extra in extras:
        if extra not in vocab:
            tokens.append(extra)
            types.append(1)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    for text in SPM_BPE_USER_DEFINED:  # a trained token of that text becomes USER_DEFINED
        if text in tokens:
            types[tokens.index(text)] = 4
        else:
            tokens.append(text)
            types.append(4)
    return {
        "general.architecture": "llama",
        "general.name": f"tiny-spm-bpe-{pre}",
        "tokenizer.ggml.model": "gemma4" if pre == "gemma4" else "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": np.uint32(tokens.index("<bos>")),
        "tokenizer.ggml.eos_token_id": np.uint32(tokens.index("<eos>")),
        "tokenizer.ggml.unknown_token_id": np.uint32(tokens.index("<unk>")),
        "tokenizer.ggml.add_bos_token": False,
    }
