"""Unigram (UGM, GGUF 't5') tokenization, transcribed from llama.cpp's llm_tokenizer_ugm.

Each text fragment is normalized first: the longest prefix that is a USER_DEFINED token is kept
as it is, else the longest prefix found in SentencePiece's precompiled character map (an
XOR-compressed double array, `tokenizer.ggml.precompiled_charsmap`) is replaced by its mapping,
else one code point is kept (an invalid byte becomes U+FFFD); spaces become U+2581, with one
prepended (`add_space_prefix`) and runs merged (`remove_extra_whitespaces`) as the GGUF says.
Then a Viterbi pass over the bytes picks the tokenization with the highest sum of token scores
(USER_DEFINED tokens score 0; a code point no token covers is the unknown token, scored the
lowest NORMAL score minus 10), and runs of unknown tokens become one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np

from loraserve.model.tokenizer_special import NORMAL, UNUSED, USER_DEFINED

_SPACE = "\u2581".encode()


class _CharsMap:
    """SentencePiece's precompiled normalization map (llama.cpp's xcda_array_view)."""

    def __init__(self, blob: bytes):
        size = struct.unpack_from("<I", blob)[0]
        self.nodes = struct.unpack_from(f"<{size // 4}I", blob, 4)
        self.replacements = blob[4 + size :]

    def _base(self, i: int) -> int:
        node = self.nodes[i]
        return (node >> 10) << ((node & (1 << 9)) >> 6)

    def longest(self, data: bytes, start: int) -> tuple[int, bytes] | None:
        """(bytes matched, replacement) for the longest mapped prefix of data[start:]."""
        nodes, found = self.nodes, None
        index = self._base(0)
        for pos in range(start, len(data)):
            c = data[pos]
            if c == 0:
                break
            index ^= c
            if index >= len(nodes) or nodes[index] & ((1 << 31) | 0xFF) != c:
                break
            leaf = (nodes[index] >> 8) & 1
            index ^= self._base(index)
            if index >= len(nodes):
                break
            if leaf:
                value = nodes[index] & ((1 << 31) - 1)
                end = self.replacements.index(b"\0", value)
                found = (pos - start + 1, self.replacements[value:end])
        return found


def _prefixes(keys: Iterable[bytes]) -> set[bytes]:
    return {key[:n] for key in keys for n in range(1, len(key) + 1)}


def _utf8_length(lead: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


def _valid_code_point(data: bytes, pos: int) -> int:
    """Length of the UTF-8 sequence at data[pos] as llama.cpp's unicode_cpt_from_utf8 checks
    it (lead and continuation bits only), or 0 where it is invalid."""
    lead = data[pos]
    n = 1 if lead < 0x80 else 0 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    if lead >= 0xF8 or n == 0 or pos + n > len(data):
        return 0
    if any(data[pos + k] & 0xC0 != 0x80 for k in range(1, n)):
        return 0
    return n


class UgmEncoder:
    """llama.cpp's UGM tokenization of one text fragment (no special tokens), as token ids."""

    def __init__(
        self,
        texts: Sequence[str],
        scores: Sequence[float],
        types: Sequence[int],
        unk_id: int,
        charsmap: bytes,
        *,
        add_space_prefix: bool = True,
        remove_extra_whitespaces: bool = False,
        escape_whitespaces: bool = True,
    ):
        self.unk_id = unk_id
        self._charsmap = _CharsMap(charsmap) if charsmap else None
        self._tokens: dict[bytes, int] = {}
        self._user: set[bytes] = set()
        scores32 = np.asarray(scores, dtype=np.float32)
        normal = scores32[np.asarray(types) == NORMAL]
        lowest = normal.min() if normal.size else np.float32(np.finfo(np.float32).max)
        self._unk_score = float(lowest - np.float32(10.0))  # float arithmetic, as llama.cpp
        self._scores = np.where(np.asarray(types) == USER_DEFINED, 0.0, scores32).tolist()
        for i, (text, kind) in enumerate(zip(texts, types, strict=True)):
            if kind in (NORMAL, USER_DEFINED, UNUSED):
                self._tokens[text.encode()] = i  # a repeated text: the trie keeps the last id
            if kind == USER_DEFINED:
                self._user.add(text.encode())
        self._prefixes = _prefixes(self._tokens)
        # llama.cpp's user-defined match is the longest prefix of the input that is a path in
        # their trie, whether or not a whole token ends there
        self._user_prefixes = _prefixes(self._user)
        self._user_longest = max(map(len, self._user), default=0)
        self._space = _SPACE if escape_whitespaces else b" "
        self._prepend = add_space_prefix
        self._merge = remove_extra_whitespaces

    def _normalize_prefix(self, data: bytes, pos: int) -> tuple[bytes, int]:
        n, end = 0, min(len(data) - pos, self._user_longest)
        while n < end and data[pos : pos + n + 1] in self._user_prefixes:
            n += 1
        if n:
            return data[pos : pos + n], n
        if self._charsmap is not None:
            found = self._charsmap.longest(data, pos)
            if found is not None:
                return found[1], found[0]
        n = _valid_code_point(data, pos)
        return (data[pos : pos + n], n) if n else ("\ufffd".encode(), 1)

    def normalize(self, text: str) -> bytes:
        """The fragment as llama.cpp's llm_tokenizer_ugm_session::normalize makes it."""
        data = text.encode("utf-8", "surrogatepass")
        out = bytearray()
        prepended = in_word = False
        pos = 0
        while pos < len(data):
            piece, used = self._normalize_prefix(data, pos)
            for c in piece:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (self._prepend and not prepended) or self._merge:
                            out += self._space
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not self._merge:
                        out += self._space
            pos += used
        return bytes(out)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (the best-scoring segmentation of its normalized bytes)."""
        data = self.normalize(text)
        n = len(data)
        if n == 0:
            return []
        best = [-float("inf")] * (n + 1)  # best score of data[:i]
        back: list[tuple[int, int]] = [(self.unk_id, 0)] * (n + 1)  # (token, start)
        best[0] = 0.0
        tokens, prefixes, scores = self._tokens, self._prefixes, self._scores
        pos = 0
        while pos < n:
            width = min(_utf8_length(data[pos]), n - pos)
            here = best[pos]
            covered = False
            end = pos + 1
            while end <= n and data[pos:end] in prefixes:
                token = tokens.get(data[pos:end])
                if token is not None:
                    covered |= end - pos == width
                    score = here + scores[token]
                    if score > best[end]:
                        best[end], back[end] = score, (token, pos)
                end += 1
            if not covered:
                score = here + self._unk_score
                if score > best[pos + width]:
                    best[pos + width], back[pos + width] = score, (self.unk_id, pos)
            pos += width
        out: list[int] = []
        end, previous_unknown = n, False
        while True:
            token, start = back[end]
            unknown = token == self.unk_id
            if not (previous_unknown and unknown):
                out.append(token)
            if start == 0:
                break
            previous_unknown, end = unknown, start
        return out[::-1]
