"""Activated LoRA (aLoRA): an adapter that acts only from the last occurrence of its
invocation sequence in the prompt on (PEFT's ``alora_invocation_tokens``, llama.cpp's GGUF
``adapter.alora.invocation_tokens``); a prompt without it runs without the adapter.

A request whose mix holds aLoRA adapters runs each position under the mix active there:
the other adapters everywhere, each aLoRA adapter from its own invocation start on (the
generated tokens after the prompt included). Its cache key is then one per position span
(`cache.prefix_cache.Spans`), so the history before the invocation is the KV of the
rest of the mix (the base model when there is no other adapter) and is shared with
requests under that mix, in both directions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loraserve.cache.prefix_cache import CacheKey, Spans, spans

PositionMixes = tuple[tuple[int, Mapping[int, float]], ...]  # (first position, scales)


def invocation_tokens(meta: Mapping[str, Any]) -> tuple[int, ...]:
    """An adapter's invocation sequence from its metadata (the GGUF key or PEFT's
    adapter_config.json); () for an ordinary adapter. ValueError for a malformed one."""
    conf = meta.get("adapter_config")
    raw = conf.get("alora_invocation_tokens") if isinstance(conf, dict) else None
    if raw is None:
        raw = meta.get("adapter.alora.invocation_tokens")
    if raw is None:
        return ()
    if hasattr(raw, "tolist"):  # the GGUF reader's arrays are numpy arrays
        raw = raw.tolist()
    if not isinstance(raw, list | tuple) or not raw:
        raise ValueError(f"alora invocation tokens must be a non-empty list, got {raw!r}")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in raw):
        raise ValueError(f"alora invocation tokens must be token ids, got {list(raw)!r}")
    return tuple(int(t) for t in raw)


def invocation_start(prompt: Sequence[int], tokens: Sequence[int]) -> int | None:
    """Where the last occurrence of ``tokens`` starts in ``prompt`` (None if absent)."""
    n = len(tokens)
    first = tokens[0]
    for i in range(len(prompt) - n, -1, -1):
        if prompt[i] == first and list(prompt[i : i + n]) == list(tokens):
            return i
    return None


def position_mixes(
    scales: Mapping[int, float],
    invocations: Mapping[int, tuple[int, ...]],
    prompt: Sequence[int],
    cache_key: Callable[[Mapping[int, float]], CacheKey],
) -> tuple[CacheKey | Spans, PositionMixes]:
    """A request's cache key along its positions and the scales active from each span on,
    for ``scales`` whose aLoRA adapters have ``invocations`` (id -> tokens)."""
    starts = {i: invocation_start(prompt, invocations[i]) for i in scales if i in invocations}
    bounds = sorted({0, *(s for s in starts.values() if s is not None)})
    out: list[tuple[int, dict[int, float]]] = []
    for b in bounds:
        on = {i: s for i, s in scales.items() if i not in starts or _active(starts[i], b)}
        if not out or out[-1][1] != on:
            out.append((b, on))
    key = spans([(b, cache_key(on)) for b, on in out])
    return key, tuple(out)


def _active(start: int | None, pos: int) -> bool:
    return start is not None and start <= pos
