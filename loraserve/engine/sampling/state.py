"""`SamplerState`: one request's generator and penalty window, alive as long as the request."""

from __future__ import annotations

import math
import secrets
from collections import Counter, deque
from collections.abc import Sequence

import torch

from loraserve.engine.sampling.params import SamplingParams


class SamplerState:
    """One request's sampler: its parameters, random generator and penalty window.

    As llama-server does, the prompt tokens enter the penalty window first. Call `accept`
    with each token the request generates, in order; `sample_batch` does not.
    Validate ``params`` (`SamplingParams.validate`) before building the state.
    """

    def __init__(self, params: SamplingParams, prompt_tokens: Sequence[int], eog_ids: set[int]):
        self.params = params
        self.eog_ids = frozenset(int(t) for t in eog_ids)
        self.seed = params.seed if params.seed != -1 else secrets.randbits(32)
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(self.seed)

        bias = [(int(t), -math.inf if b is False else float(b)) for t, b in params.logit_bias]
        if params.ignore_eos:
            bias += [(t, -math.inf) for t in sorted(self.eog_ids)]
        self.bias_ids = torch.tensor([t for t, _ in bias], dtype=torch.int64)  # [m]
        self.bias_values = torch.tensor([b for _, b in bias], dtype=torch.float32)  # [m]

        self.penalized = params.penalties_enabled
        self.modifies_logits = self.penalized or bool(bias)
        self.plain_greedy = params.greedy and not self.modifies_logits and params.n_probs == 0
        # greedy under a bias of distinct tokens only (ignore_eos, most logit_bias): its token
        # follows from the raw argmax and the biased logits (`ops.biased_argmax`)
        self.bias_greedy = (
            params.greedy
            and not self.penalized
            and params.n_probs == 0
            and bool(bias)
            and len({t for t, _ in bias}) == len(bias)
        )
        # Invariant: _counts[t] == number of occurrences of t in _window (only when penalized).
        self._window_len = params.repeat_last_n if params.repeat_last_n > 0 else None
        tail = list(prompt_tokens)[-self._window_len :] if self._window_len else prompt_tokens
        self._window: deque[int] = deque(int(t) for t in tail) if self.penalized else deque()
        self._counts: Counter[int] = Counter(self._window)
        self._penalty_tensors: tuple[torch.Tensor, torch.Tensor] | None = None

    def accept(self, token: int) -> None:
        """Record a generated token in the penalty window."""
        if not self.penalized:
            return
        token = int(token)
        self._window.append(token)
        self._counts[token] += 1
        if self._window_len is not None and len(self._window) > self._window_len:
            old = self._window.popleft()
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]
        self._penalty_tensors = None

    def penalty_counts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Distinct tokens of the window and their counts: ids [m] int64, counts [m] float32."""
        if self._penalty_tensors is None:
            ids = torch.tensor(list(self._counts.keys()), dtype=torch.int64)
            counts = torch.tensor(list(self._counts.values()), dtype=torch.float32)
            self._penalty_tensors = (ids, counts)
        return self._penalty_tensors
