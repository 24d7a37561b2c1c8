"""Tokenizer equal to llama.cpp's: GGUF 'llama' (SentencePiece), 'gpt2' (BPE), 't5' (unigram).

Encoding follows llama_vocab::tokenize: special-token text is cut out of the input first
(`SpecialSplitter`), each remaining fragment is encoded on its own by the vocabulary's model
(`tokenizer_spm` / `tokenizer_bpe` with `tokenizer_pretok` / `tokenizer_ugm`), BOS/EOS are
added as the vocabulary asks. Token bytes follow token_to_piece with special=true, as
llama-server's /detokenize does.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loraserve.model.tokenizer_bpe import BpeEncoder, byte_level_decode, hf_dir_parts
from loraserve.model.tokenizer_bpe_spm import SPM_STYLE_PRES, SpmStyleBpe
from loraserve.model.tokenizer_rwkv import RwkvEncoder
from loraserve.model.tokenizer_rwkv import unescape as rwkv_unescape
from loraserve.model.tokenizer_special import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    SpecialSplitter,
    mark_special_tokens,
    strip_ids,
)
from loraserve.model.tokenizer_spm import build_spm
from loraserve.model.tokenizer_ugm import UgmEncoder


def test_vocab(
    texts: list[str],
) -> tuple[Callable[[str, bool], list[int]], Callable[[str], bytes]]:
    """llama.cpp's ``test`` vocabulary (tokens ``tok_N``), as llama_vocab tokenizes it: each
    run of 5 UTF-8 bytes becomes token ``h % n_vocab`` with ``h = h * 31 + byte`` over the
    run (64-bit wrap-around); token N reads back as N in lower-case hex."""
    n = len(texts)
    hexes = {t: format(i, "x").encode() for i, t in enumerate(texts)}

    def encode_fragment(text: str, after_special: bool) -> list[int]:
        data, out = text.encode(), []
        for lo in range(0, len(data), 5):
            h = 0
            for b in data[lo : lo + 5]:
                h = (h * 31 + b) & 0xFFFFFFFFFFFFFFFF
            out.append(h % n)
        return out

    return encode_fragment, hexes.__getitem__


def _as_list(value: Any) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


class Tokenizer:
    """Text <-> token ids for one vocabulary, with llama.cpp's results.

    Build with `from_gguf_metadata` or `from_hf_dir`. `eog_ids` holds every id that ends
    generation (llama_vocab_is_eog). Thread-safe for concurrent encode/decode.
    """

    def __init__(
        self,
        *,
        texts: list[str],
        types: list[int],
        to_bytes: Callable[[str], bytes],
        encode_fragment: Callable[[str, bool], list[int]],
        bos_id: int | None,
        eos_id: int | None,
        eog_ids: set[int],
        add_bos: bool,
        add_eos: bool = False,
        chat_template: str | None = None,
        lstrip_ids: set[int] | None = None,
        rstrip_ids: set[int] | None = None,
        raw_pieces: bool = False,
    ):
        self.vocab_size = len(texts)
        self._raw_pieces = raw_pieces  # to_bytes gives every token's bytes, whatever its type
        self.bos_id, self.eos_id, self.eog_ids = bos_id, eos_id, eog_ids
        self.add_bos, self.add_eos = add_bos, add_eos
        self.chat_template = chat_template
        self._texts, self._types, self._to_bytes = texts, types, to_bytes
        self._encode_fragment = encode_fragment
        kinds = np.asarray(types)
        special_ids = np.flatnonzero(np.isin(kinds, (CONTROL, USER_DEFINED, UNKNOWN))).tolist()
        special = {texts[i]: i for i in special_ids}
        always = {t: i for t, i in special.items() if types[i] == USER_DEFINED}
        strip = (lstrip_ids or set(), rstrip_ids or set())
        self._splitters = {
            True: SpecialSplitter(special, *strip),
            False: SpecialSplitter(always, *strip),
        }

    @staticmethod
    def from_gguf_metadata(meta: dict[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (`tokenizer.ggml.*`), as llama_vocab::impl::load does."""
        model = meta["tokenizer.ggml.model"]
        texts = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(meta["tokenizer.ggml.tokens"])]
        n = len(texts)
        types = _as_list(meta.get("tokenizer.ggml.token_type", [NORMAL] * n))
        scores = _as_list(meta.get("tokenizer.ggml.scores", [0.0] * n))

        def key(name: str, default: Any) -> Any:
            return meta.get(f"tokenizer.ggml.{name}", default)

        def token_id(name: str, default: int | None) -> int | None:
            value = key(f"{name}_token_id", default)
            if value is not None and 0 <= int(value) < n:
                return int(value)
            return default if default is not None and default < n else None

        raw_pieces = force_bos = False
        if model == "llama":
            bos, eos, unk = token_id("bos", 1), token_id("eos", 2), token_id("unknown", 0)
            sp = build_spm(texts, scores, types, unk if unk is not None else 0)
            space_prefix = bool(key("add_space_prefix", True))

            def encode_fragment(text: str, after_special: bool) -> list[int]:
                return sp.encode(" " + text if space_prefix and after_special else text)

            def to_bytes(text: str) -> bytes:
                return text.replace("\u2581", " ").encode()

            add_bos = True
        elif model == "gemma4" or (model == "gpt2" and key("pre", "") in SPM_STYLE_PRES):
            default = None if model == "gemma4" else 11  # gemma4: no default special ids
            bos, eos = token_id("bos", default), token_id("eos", default)
            pre = "gemma4" if model == "gemma4" else key("pre", "")
            spm_bpe = SpmStyleBpe(texts, meta["tokenizer.ggml.merges"], pre)

            def encode_fragment(text: str, after_special: bool) -> list[int]:
                return spm_bpe.encode(text)

            def to_bytes(text: str) -> bytes:
                return text.replace("\u2581", " ").encode()

            add_bos = force_bos = spm_bpe.force_bos
        elif model == "gpt2":
            merges = meta.get("tokenizer.ggml.merges", [])  # kimi-k2 may have none
            bpe = BpeEncoder(texts, merges, key("pre", "default"))
            bos, eos = token_id("bos", None if bpe.pre.no_bos else 11), token_id("eos", 11)
            add_bos = bpe.pre.add_bos

            def encode_fragment(text: str, after_special: bool) -> list[int]:
                return bpe.encode(text)

            to_bytes = byte_level_decode
        elif model == "t5":  # unigram (LLAMA_VOCAB_TYPE_UGM)
            bos, eos, unk = token_id("bos", None), token_id("eos", 1), token_id("unknown", 2)
            ugm = UgmEncoder(
                texts,
                scores,
                types,
                unk if unk is not None else 2,
                np.asarray(key("precompiled_charsmap", [])).astype(np.uint8).tobytes(),
                add_space_prefix=bool(key("add_space_prefix", True)),
                remove_extra_whitespaces=bool(key("remove_extra_whitespaces", False)),
            )

            def encode_fragment(text: str, after_special: bool) -> list[int]:
                return ugm.encode(text)

            def to_bytes(text: str) -> bytes:
                return text.replace("\u2581", " ").encode()

            add_bos = False
        elif model == "rwkv":  # RWKV world (LLAMA_VOCAB_TYPE_RWKV): every piece is its bytes
            bos, eos = token_id("bos", None), token_id("eos", None)
            rwkv = RwkvEncoder(texts, token_id("unknown", None))

            def encode_fragment(text: str, after_special: bool) -> list[int]:
                return rwkv.encode(text)

            to_bytes = rwkv_unescape
            raw_pieces = True
            add_bos = False
        elif model == "test":  # llama.cpp's test models (LLAMA_VOCAB_TYPE_TEST)
            bos = eos = None
            encode_fragment, to_bytes = test_vocab(texts)
            add_bos = False
        else:
            raise ValueError(f"unsupported tokenizer model {model!r}")

        eog_ids = mark_special_tokens(texts, types, token_id, eos)
        name, arch = meta.get("general.name", ""), meta.get("general.architecture", "")
        lstrip, rstrip = strip_ids(texts, types, name, key("pre", ""), arch)
        return Tokenizer(
            texts=texts,
            types=types,
            to_bytes=to_bytes,
            encode_fragment=encode_fragment,
            bos_id=bos,
            eos_id=eos,
            eog_ids=eog_ids,
            add_bos=bool(key("add_bos_token", add_bos)) or force_bos,
            add_eos=bool(key("add_eos_token", model == "t5")),
            chat_template=meta.get("tokenizer.chat_template"),
            lstrip_ids=lstrip,
            rstrip_ids=rstrip,
            raw_pieces=raw_pieces,
        )

    @staticmethod
    def from_hf_dir(path: str | Path) -> Tokenizer:
        """Build from a Hugging Face folder (tokenizer.json, tokenizer_config.json)."""
        parts = hf_dir_parts(Path(path))
        ids = parts.pop("special_ids")
        parts["eog_ids"] = mark_special_tokens(
            parts["texts"], parts["types"], ids.get, parts["eos_id"]
        )
        return Tokenizer(**parts)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text` as llama_tokenize(text, add_special, parse_special)."""
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        after_special = True
        for fragment in self._splitters[parse_special].split(text):
            if isinstance(fragment, int):
                out.append(fragment)
                after_special = True
            else:
                out += self._encode_fragment(fragment, after_special)
                after_special = False
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def token_bytes(self, token_id: int) -> bytes:
        """Bytes of one token as llama.cpp's token_to_piece(special=true).

        NORMAL: the text (U+2581 -> space for SentencePiece, byte-level decoded for BPE);
        CONTROL / USER_DEFINED / UNKNOWN: the stored text; BYTE: the raw byte; UNUSED: empty.
        RWKV: every token's unescaped bytes.
        """
        if not 0 <= token_id < self.vocab_size:
            raise IndexError(f"token id {token_id} out of range [0, {self.vocab_size})")
        ttype = self._types[token_id]
        text = self._texts[token_id]
        if self._raw_pieces:
            return self._to_bytes(text)
        if ttype in (CONTROL, USER_DEFINED, UNKNOWN):
            return text.encode()
        if ttype == NORMAL:
            return self._to_bytes(text)
        if ttype == BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`: their bytes joined, decoded as UTF-8 with replacement."""
        return b"".join(map(self.token_bytes, ids)).decode("utf-8", errors="replace")

    def piece(self, token_id: int) -> str:
        """Text of one token (invalid UTF-8 replaced; use `token_bytes` for the raw bytes)."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")


class StreamDecoder:
    """Incremental detokenizer: text is released only once its UTF-8 bytes are complete.

    Incomplete multi-byte sequences are held back until the next token completes them;
    invalid bytes become U+FFFD.
    """

    def __init__(self, tok: Tokenizer):
        self._tok = tok
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly "")."""
        return self._utf8.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """Release whatever is held back (an incomplete tail becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)
