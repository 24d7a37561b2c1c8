"""Vocabularies run by the `tokenizers` library: GGUF 'gpt2' BPE and Hugging Face folders.

llama.cpp splits each text fragment with the pre-tokenizer regexes of the vocabulary's
`tokenizer.ggml.pre` (`tokenizer_pretok`), maps bytes to GPT-2's printable characters, then
merges by rank (a word that is a whole token is taken as it is where the pre-tokenizer says
`ignore_merges`). A `tokenizers` BPE with the same vocabulary and merges after those splits and
`ByteLevel` does the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers

from loraserve.model.tokenizer_pretok import PRE_TYPES, PreType
from loraserve.model.tokenizer_pretok_custom import CUSTOM_STEPS
from loraserve.model.tokenizer_regex import RegexSplitter

UNKNOWN_CHAR = "\u0000<loraserve:unknown>"


@cache
def byte_to_char() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@cache
def char_to_byte() -> dict[str, int]:
    """Inverse of `byte_to_char`."""
    return {c: b for b, c in byte_to_char().items()}


def byte_level_decode(text: str) -> bytes:
    """Bytes of a byte-level token text, as llama.cpp's llama_decode_text."""
    table = char_to_byte()
    out = bytearray()
    for ch in text:
        b = table.get(ch)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + ch.encode().hex().encode() + text.encode() + b"]"
    return bytes(out)


def build_bpe(texts: Sequence[str], merges: Sequence[str], pre: str) -> tuple[Tokenizer, bool]:
    """A `tokenizers` BPE equal to llama.cpp's for GGUF 'gpt2' vocabularies.

    Returns the tokenizer (which knows no added tokens: special text is cut out before it runs)
    and whether llama.cpp adds BOS by default for this pre-tokenizer. A character missing from
    the vocabulary becomes id len(texts), which callers drop: llama.cpp keeps it as a symbol
    that no merge crosses and emits nothing for it. `BpeEncoder` wraps it with the split that
    matches llama.cpp on every code point.
    """
    kind = pre_type(pre)
    tok = _bpe_model(texts, merges, kind.ignore_merges)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [RegexSplitter(kind.regexes).split, pre_tokenizers.ByteLevel(False, use_regex=False)]
    )
    return tok, kind.add_bos


def pre_type(pre: str) -> PreType:
    """The PreType of a `tokenizer.ggml.pre` value; ValueError for one not supported."""
    if pre not in PRE_TYPES:
        raise ValueError(f"unsupported BPE pre-tokenizer {pre!r}")
    return PRE_TYPES[pre]


def _bpe_model(texts: Sequence[str], merges: Sequence[str], ignore_merges: bool) -> Tokenizer:
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        pairs.append((merge[:cut], merge[cut + 1 :]) if cut >= 0 else ("", ""))
    vocab = {text: i for i, text in enumerate(texts)}
    vocab[UNKNOWN_CHAR] = len(texts)
    model = models.BPE(
        vocab, pairs, unk_token=UNKNOWN_CHAR, fuse_unk=False, ignore_merges=ignore_merges
    )
    return Tokenizer(model)


class BpeEncoder:
    """llama.cpp's BPE tokenization of one text fragment (no special tokens), as token ids.

    Text whose every code point llama.cpp and `tokenizers` classify alike runs through one
    `tokenizers` call; other text is split through a copy (`RegexSplitter.words`) and its
    pieces are then byte-level encoded and merged by the same model.
    """

    def __init__(self, texts: Sequence[str], merges: Sequence[str], pre: str):
        self.pre = pre_type(pre)
        self.n_vocab = len(texts)
        self._model_args = (texts, merges)
        self._words: Tokenizer | None = None  # built on the first text that needs it
        regexes = self.pre.regexes
        # llama.cpp's hand-written steps (kimi-k2, afmoe, tiny_aya, superbpe): every text goes
        # through the steps here, one piece at a time
        self._steps = None
        if any(r in CUSTOM_STEPS for r in regexes):
            self._steps = [CUSTOM_STEPS.get(r) or RegexSplitter([r]).words for r in regexes]
            return
        self._fast, _ = build_bpe(texts, merges, pre)
        self._splitter = RegexSplitter(regexes)

    def _words_model(self) -> Tokenizer:
        if self._words is None:
            self._words = _bpe_model(*self._model_args, self.pre.ignore_merges)
            self._words.pre_tokenizer = pre_tokenizers.ByteLevel(False, use_regex=False)
        return self._words

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        if self._steps is not None:
            words = [text]
            for step in self._steps:
                words = [word for piece in words for word in step(piece)]
            if not words:
                return []
            words_model = self._words_model()
            ids = words_model.encode(words, is_pretokenized=True, add_special_tokens=False).ids
        elif self._splitter.needs_stand_ins(text):
            words = self._splitter.words(text)
            if not words:
                return []
            words_model = self._words_model()
            ids = words_model.encode(words, is_pretokenized=True, add_special_tokens=False).ids
        else:
            ids = self._fast.encode(text, add_special_tokens=False).ids
        n = self.n_vocab
        return [i for i in ids if i < n]


def _chat_template(path: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default", next(iter(named.values()), None))
    if template is None and (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()
    return template


def hf_dir_parts(path: Path) -> dict[str, Any]:
    """Constructor arguments of `Tokenizer` for a Hugging Face tokenizer folder.

    Added tokens are typed as convert_hf_to_gguf.py does (special -> CONTROL, others
    USER_DEFINED), so special text is cut out the llama.cpp way before `tokenizers` runs.
    """
    spec = json.loads((path / "tokenizer.json").read_text())
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.encode_special_tokens = True
    n = tok.get_vocab_size(with_added_tokens=True)
    texts = [tok.id_to_token(i) or f"[PAD{i}]" for i in range(n)]
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
    byte_fallback = bool((spec.get("model") or {}).get("byte_fallback"))
    types = [1] * n
    for i, text in enumerate(texts):
        if byte_fallback and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types[i] = 6
    for i, added in tok.get_added_tokens_decoder().items():
        types[i] = 3 if added.special else 4

    def token_of(name: str) -> int | None:
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        return tok.token_to_id(value) if isinstance(value, str) else None

    bos, eos = token_of("bos_token"), token_of("eos_token")
    with_special = tok.encode("a", add_special_tokens=True).ids
    add_bos = config.get("add_bos_token", bos is not None and with_special[:1] == [bos])
    add_eos = config.get("add_eos_token", eos is not None and with_special[-1:] == [eos])

    def encode_fragment(text: str, after_special: bool) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def to_bytes(text: str) -> bytes:
        return byte_level_decode(text) if byte_level else text.replace("\u2581", " ").encode()

    return {
        "texts": texts,
        "types": types,
        "to_bytes": to_bytes,
        "encode_fragment": encode_fragment,
        "bos_id": bos,
        "eos_id": eos,
        "add_bos": bool(add_bos),
        "add_eos": bool(add_eos),
        "chat_template": _chat_template(path, config),
        "special_ids": {"eot": token_of("eot_token")},
    }
