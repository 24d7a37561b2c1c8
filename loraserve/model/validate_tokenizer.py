"""The tokenizer's metadata checked before the tokenizer reads it: types and lengths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from loraserve.model.validate_common import MAX_VOCAB, ModelFileError, is_int, show_value


def check_tokenizer(meta: Mapping[str, Any]) -> int:
    """The tokenizer's metadata has the types and lengths the tokenizer reads: tokens a list
    of strings, scores and types one per token, merges strings, special ids integers. Returns
    the token count; `ModelFileError` otherwise."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelFileError("the model has no tokenizer (tokenizer.ggml.tokens)")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ModelFileError("tokenizer.ggml.tokens must be a non-empty array of strings")
    n = len(tokens)
    if n > MAX_VOCAB:
        raise ModelFileError(f"tokenizer.ggml.tokens has {n} tokens (at most {MAX_VOCAB})")
    model = meta.get("tokenizer.ggml.model")
    if not isinstance(model, str):
        raise ModelFileError(f"tokenizer.ggml.model must be a string, got {show_value(model)}")
    for key, kind in (("scores", "f"), ("token_type", "i")):
        v = meta.get(f"tokenizer.ggml.{key}")
        ok = v is None or (
            isinstance(v, np.ndarray)
            and v.ndim == 1
            and len(v) == n
            and v.dtype.kind in kind + "iu"
        )
        if not ok:
            raise ModelFileError(f"tokenizer.ggml.{key} must be {n} numbers, one per token")
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None and not (
        isinstance(merges, list) and all(isinstance(m, str) for m in merges)
    ):
        raise ModelFileError("tokenizer.ggml.merges must be an array of strings")
    for key, v in meta.items():
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id") and v is not None:
            if not is_int(v):
                raise ModelFileError(f"{key} = {show_value(v)}: must be an integer token id")
    return n
