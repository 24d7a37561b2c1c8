"""RWKV 'world' vocabularies (GGUF 'rwkv'), as llama.cpp's llm_tokenizer_rwkv runs them.

Each token's text is its bytes written as Python writes a bytes literal's inside (`\\n`, `\\t`,
`\\r`, `\\xNN`, `\\\\`, `\\'`); tokenizing is greedy: at each byte the longest token that
starts there. llama.cpp's token_to_piece gives every token's unescaped bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

_ESCAPES = {ord("t"): 9, ord("n"): 10, ord("r"): 13}


def unescape(text: str) -> bytes:
    """The bytes of an RWKV token text (llama_unescape_rwkv_token)."""
    out = bytearray()
    data = text.encode()
    i = 0
    while i < len(data):
        c = data[i]
        if c == ord("\\"):
            if i + 1 == len(data):
                break  # a lone trailing backslash escapes nothing
            nxt = data[i + 1]
            if nxt == ord("x"):
                digits = data[i + 2 : i + 4].decode()
                out.append(int(digits, 16))  # llama.cpp: lower-case hex digits
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


class RwkvEncoder:
    """Greedy longest-match tokenization over bytes (llm_tokenizer_rwkv_session)."""

    def __init__(self, texts: Sequence[str], unk_id: int | None):
        self._tokens: dict[bytes, int] = {}
        for i, text in enumerate(texts):
            self._tokens[unescape(text)] = i  # a repeated text: llama.cpp's trie keeps the last
        self._prefixes = {k[:n] for k in self._tokens for n in range(1, len(k) + 1)}
        self._unk = unk_id

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`. A byte no token starts with gives the unknown token (none in a
        real world vocabulary, which holds all 256 bytes); llama.cpp gives LLAMA_TOKEN_NULL
        when the vocabulary has no unknown token, and this leaves it out."""
        data = text.encode("utf-8", "surrogatepass")
        tokens, prefixes = self._tokens, self._prefixes
        out: list[int] = []
        pos, n = 0, len(data)
        while pos < n:
            end, best, best_end = pos + 1, None, pos + 1
            while end <= n and data[pos:end] in prefixes:
                token = tokens.get(data[pos:end])
                if token is not None:
                    best, best_end = token, end
                end += 1
            if best is None:
                if self._unk is not None:
                    out.append(self._unk)
            else:
                out.append(best)
            pos = best_end
        return out
