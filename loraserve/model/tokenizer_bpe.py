"""Vocabularies run by the `tokenizers` library: GGUF 'gpt2' BPE and Hugging Face folders.

llama.cpp splits each text fragment with the pre-tokenizer regexes of the vocabulary's
`tokenizer.ggml.pre` (each regex splits the pieces of the previous one, keeping matches and the
text between them), maps bytes to GPT-2's printable characters, then merges by rank. A
`tokenizers` BPE with the same vocabulary, merges and `Split(..., "isolated")` pre-tokenizers
followed by `ByteLevel` does the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]

UNKNOWN_CHAR = "\u0000<loraserve:unknown>"

# tokenizer.ggml.pre -> (regexes as in llama.cpp's llm_tokenizer_bpe, ignore_merges, add_bos)
PRE_TOKENIZERS: dict[str, tuple[list[str], bool, bool]] = {
    "default": (_DEFAULT, False, False),
    **{
        name: ([_LLAMA3], True, True)
        for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "lfm2")
    },
    **{name: ([_LLAMA3], False, False) for name in ("dbrx", "smaug-bpe")},
    **{name: ([_GPT2], False, False) for name in ("gpt-2", "gpt2", "phi-2", "mpt", "olmo")},
    **{
        name: ([r"\p{N}", _GPT2], False, False)
        for name in ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone")
    },
    **{
        name: ([_QWEN2], False, False)
        for name in ("qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan")
    },
}


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
    that no merge crosses and emits nothing for it.
    """
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"unsupported BPE pre-tokenizer {pre!r}")
    regexes, ignore_merges, add_bos = PRE_TOKENIZERS[pre]
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        pairs.append((merge[:cut], merge[cut + 1 :]) if cut >= 0 else ("", ""))
    vocab = {text: i for i, text in enumerate(texts)}
    vocab[UNKNOWN_CHAR] = len(texts)
    tok = Tokenizer(
        models.BPE(
            vocab, pairs, unk_token=UNKNOWN_CHAR, fuse_unk=False, ignore_merges=ignore_merges
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return tok, add_bos


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
