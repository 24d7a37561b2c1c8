"""`SamplingParams`: a request's sampling settings, with llama-server's names and defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass

_MAX_SEED = 2**64 - 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return float(value)


def _finite(name: str, value: object) -> float:
    v = _real(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _unit(name: str, value: object) -> float:
    v = _real(name, value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {v}")
    return v


def _int_at_least(name: str, value: object, low: int, high: int | None = None) -> int:
    if not _is_int(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request; defaults are llama-server's.

    - ``temperature <= 0`` is greedy: the most likely token after logit_bias and penalties.
    - ``top_k <= 0`` (or >= vocab), ``top_p >= 1``, ``min_p <= 0`` disable that sampler; a
      negative top_k is accepted as "disabled" (llama-server clamps it to 0, vLLM clients send
      -1).
    - ``repeat_last_n``: penalty window over prompt and generated tokens; 0 = off,
      -1 = the whole sequence (the context).
    - ``logit_bias``: (token id, bias) pairs added to the logits (repeated ids add up, as in
      llama.cpp); a bias of ``-inf`` or ``False`` bans the token.
    - ``ignore_eos``: every end-of-generation token gets a ``-inf`` bias.
    - ``seed``: -1 draws a random seed; any other value makes the request's tokens
      reproducible whatever else shares its batch.
    - ``n_probs`` / ``post_sampling_probs``: see `SampleResult`.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = -1
    n_probs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    post_sampling_probs: bool = False

    @property
    def greedy(self) -> bool:
        """Temperature <= 0: the argmax after logit_bias and penalties (llama.cpp semantics)."""
        return self.temperature <= 0.0

    @property
    def penalties_enabled(self) -> bool:
        """Whether the penalty sampler changes anything (llama.cpp's ``is_disabled``, negated)."""
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    def validate(self, vocab_size: int) -> None:
        """Raise `ValueError` whose message starts with the offending field's name."""
        _finite("temperature", self.temperature)
        if not _is_int(self.top_k):
            raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
        _unit("top_p", self.top_p)
        _unit("min_p", self.min_p)
        repeat = _finite("repeat_penalty", self.repeat_penalty)
        if repeat <= 0.0 or not math.isfinite(1.0 / repeat):
            raise ValueError(f"repeat_penalty must be greater than 0, got {repeat}")
        _int_at_least("repeat_last_n", self.repeat_last_n, -1)
        _finite("presence_penalty", self.presence_penalty)
        _finite("frequency_penalty", self.frequency_penalty)
        _int_at_least("seed", self.seed, -1, _MAX_SEED)
        _int_at_least("n_probs", self.n_probs, 0)
        for name in ("ignore_eos", "post_sampling_probs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        self._validate_logit_bias(vocab_size)

    def _validate_logit_bias(self, vocab_size: int) -> None:
        if not isinstance(self.logit_bias, tuple | list):
            raise ValueError("logit_bias must be a sequence of (token id, bias) pairs")
        for entry in self.logit_bias:
            if not isinstance(entry, tuple | list) or len(entry) != 2:
                raise ValueError(
                    f"logit_bias entries must be (token id, bias) pairs, got {entry!r}"
                )
            token, bias = entry
            if not _is_int(token) or not 0 <= token < vocab_size:
                raise ValueError(f"logit_bias token id must be in [0, {vocab_size}), got {token!r}")
            if bias is False:
                continue
            if bias is True:
                raise ValueError("logit_bias bias must be a number or false (ban), got true")
            if _real("logit_bias bias", bias) == math.inf:
                raise ValueError(f"logit_bias bias for token {token} must not be +inf")
        banned = {t for t, b in self.logit_bias if b is False or b == -math.inf}
        if len(banned) >= vocab_size:
            raise ValueError("logit_bias bans every token of the vocabulary")
