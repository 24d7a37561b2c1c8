"""Model-free drafts, as llama.cpp's `ngram-simple` and `ngram-mod` make them.

- `ngram_simple_draft`: the last ``size_n`` tokens (history plus the token just sampled)
  looked up backwards in the request's own prompt and output; the ``size_m`` tokens that
  followed the most recent earlier occurrence are the draft (common/ngram-map.cpp).
- `NgramMod`: a table from every ``n_match``-gram seen to the token that followed it, fed
  with each request's prompt and output; a draft chains lookups from the sequence's last
  ``n_match`` tokens (common/ngram-mod.cpp, here an exact dict instead of a hash table).
  `ModPools` keeps one table per adapter cache key, so text generated under one adapter
  configuration never drafts for another's.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from loraserve.cache.prefix_cache import CacheKey

MAX_ENTRIES = 1 << 20  # a table this full is cleared (llama.cpp resets at 25% occupancy)


def ngram_simple_draft(
    history: Sequence[int], size_n: int, size_m: int, packed: TokenBytes | None = None
) -> list[int]:
    """llama.cpp's `common_ngram_simple_draft`: ``history`` is the sequence so far, ending
    with the token just sampled (whose KV is not computed yet). The most recent earlier
    occurrence of its last ``size_n`` tokens (never at position 0) is followed by the draft,
    at most ``size_m`` tokens and at least ``size_n``; empty when nothing matches.
    ``packed``: the same history as `TokenBytes`, which finds the occurrence in C."""
    cur = len(history) - 1  # tokens before the sampled one
    if cur <= size_n + size_m + 1:
        return []
    if packed is not None:
        match = packed.rfind_before(cur - size_n + 1, size_n, cur - 1)
    else:
        pattern = list(history[cur - size_n + 1 : cur + 1])
        match = 0  # position 0 means no match, as in llama.cpp
        for j in range(cur - size_n - 1, 0, -1):
            if history[j] == pattern[0] and list(history[j : j + size_n]) == pattern:
                match = j
                break
    if match <= 0:
        return []
    n = min(size_m, cur - (match + size_n))
    if n < size_n:
        return []
    return list(history[match + size_n : match + size_n + n])


class TokenBytes:
    """A growing token sequence packed 4 bytes a token, searched with `bytes.rfind`."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.n = 0

    def sync(self, tokens: Sequence[int]) -> None:
        """Append the tokens of ``tokens`` past the ones already packed (a prefix of it)."""
        if len(tokens) > self.n:
            self.buf += array("i", tokens[self.n :]).tobytes()
            self.n = len(tokens)

    def rfind_before(self, start: int, size: int, end: int) -> int:
        """The last position j >= 1 with tokens[j : j + size] == tokens[start : start +
        size] and j + size <= end (-1 if none)."""
        pat = bytes(self.buf[4 * start : 4 * (start + size)])
        hi = 4 * end
        while True:
            pos = self.buf.rfind(pat, 4, hi)
            if pos < 0:
                return -1
            if pos % 4 == 0:
                return pos // 4
            hi = pos + len(pat) - 1  # a match across token boundaries: look before it


class NgramMod:
    """``n``-gram -> next token, over every sequence fed to it (one adapter cache key)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.table: dict[tuple[int, ...], int] = {}

    def add(self, tokens: Sequence[int], start: int, end: int) -> None:
        """Record the n-grams starting at ``start..end-1`` (each needs its next token)."""
        n, t = self.n, self.table
        for i in range(max(start, 0), min(end, len(tokens) - n)):
            t[tuple(tokens[i : i + n])] = tokens[i + n]
        if len(t) > MAX_ENTRIES:
            t.clear()

    def draft(self, history: Sequence[int], n_min: int, n_max: int) -> list[int]:
        """Chain lookups from the last ``n`` tokens of ``history`` (ending with the token
        just sampled); a chain shorter than ``n_min`` (or empty) is no draft."""
        n = self.n
        if len(history) < n:
            return []
        window = list(history[len(history) - n :])
        out: list[int] = []
        for _ in range(n_max):
            nxt = self.table.get(tuple(window[len(window) - n :]))
            if nxt is None:
                break
            out.append(nxt)
            window.append(nxt)
        return out if len(out) >= max(n_min, 1) else []


class ModPools:
    """One `NgramMod` per adapter cache key, shared by the slots (`ngram-mod`)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pools: dict[CacheKey, NgramMod] = {}

    def get(self, key: CacheKey) -> NgramMod:
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = NgramMod(self.n)
        return pool

    def drop(self, pred: object) -> None:
        """Forget the pools whose cache key satisfies ``pred(key)`` (an adapter unloaded)."""
        for key in [k for k in self.pools if pred(k)]:  # type: ignore[operator]
            del self.pools[key]
