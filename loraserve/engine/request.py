"""A request as the engine sees it, and the events it sends back.

`Engine.submit` builds the `Request`s (tokens, sampling, limits) and, at receipt on the
engine thread, fixes each one's `Mix` (the effective adapter mix and its cache key); the
caller reads `Event`s from each request's queue.
"""

from __future__ import annotations

import itertools
import queue
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

import torch

from loraserve.cache.prefix_cache import CacheKey, Spans, salted
from loraserve.engine.budget import BudgetSpec
from loraserve.engine.constraint import Constraint
from loraserve.engine.embedding import Pooler, Pooling
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.sampling.state import SamplerState
from loraserve.engine.spec.config import SpecRequest
from loraserve.lora.alora import PositionMixes
from loraserve.lora.registry import BASE, Mix

if TYPE_CHECKING:
    from loraserve.engine.spec.drafter import SpecRun

_ids = itertools.count(1)


class StopType(StrEnum):
    NONE = "none"
    EOS = "eos"
    WORD = "word"
    LIMIT = "limit"


@dataclass
class Timings:
    """llama-server's `timings` object, filled by the engine. Generation rates count the
    tokens after the first (which comes from the prompt's last logits, not a decode step,
    as llama-server does): one token has rate 0."""

    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    draft_n: int = 0  # speculative decoding: draft tokens verified (shown when > 0)
    draft_n_accepted: int = 0

    def as_dict(self) -> dict[str, float | int]:
        def per(n: int, ms: float) -> tuple[float, float]:
            return (ms / n if n else 0.0, 1000.0 * n / ms if ms > 0 else 0.0)

        ppt, pps = per(self.prompt_n, self.prompt_ms)
        dpt, dps = per(max(self.predicted_n - 1, 0), self.predicted_ms)
        draft = {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted}
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": ppt,
            "prompt_per_second": pps,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": dpt,
            "predicted_per_second": dps,
            **(draft if self.draft_n else {}),
        }


@dataclass(frozen=True)
class Progress:
    """Prompt processing so far (llama-server's `prompt_progress`): the prompt's tokens,
    those reused from the cache, those whose KV is computed (cache included), and the
    milliseconds since the prompt started."""

    total: int
    cache: int
    processed: int
    time_ms: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "total": self.total,
            "cache": self.cache,
            "processed": self.processed,
            "time_ms": round(self.time_ms),
        }


@dataclass
class Event:
    """One message from the engine to a request's reader.

    Token events carry the new token, the text that became complete, and its
    probabilities; the final event has ``done=True`` and the finished fields.
    """

    token: int | None = None
    text: str = ""
    probs: list[tuple[int, float]] | None = None
    prob: float | None = None  # the sampled token's probability (with n_probs)
    done: bool = False
    stop_type: StopType = StopType.NONE
    stopping_word: str = ""
    error: str | None = None  # set when the request failed inside the engine
    error_type: str = "server_error"
    # final event only: what llama-server reports about the finished request
    timings: Timings | None = None
    id_slot: int = -1
    n_prompt: int = 0  # tokens_evaluated
    n_cached: int = 0  # tokens_cached (prompt tokens reused)
    n_generated: int = 0
    truncated: bool = False  # generation stopped because the slot's context was full
    embedding: torch.Tensor | None = None  # an embedding request's pooled result
    progress: Progress | None = None  # a prompt-progress event (no token), when the request
    # asked (`Request.progress`): at admission and after each prefill chunk


@dataclass
class Request:
    """Everything the engine needs to run one completion (made by `Engine.submit`).

    ``mix`` is set once, by the engine at receipt; the cache key is the mix's, so the two
    can never disagree.
    """

    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int  # -1: until the context is full
    stop: tuple[str, ...] = ()
    cache_prompt: bool = True
    id_slot: int = -1
    eog_ids: frozenset[int] = frozenset()
    id: int = field(default_factory=lambda: next(_ids))
    events: queue.Queue[Event] = field(default_factory=queue.Queue)
    cancelled: bool = False  # set by `Engine.cancel`; the engine frees the slot next step
    pooling: Pooling | None = None  # an embedding request: pooled, never sampled
    grammar: str | None = None  # constrained generation: llguidance's grammar text
    reasoning_budget: BudgetSpec | None = None  # the end marker forced after N reasoning tokens
    spec: SpecRequest | None = None  # the request's `speculative.*` fields
    leader: Request | None = None  # same prompt: wait for its prefill and share that KV (`n`)
    progress: bool = False  # send prompt-progress events (`Event.progress`)
    client: str = ""  # who asked (API key digest or peer address): fair admission
    cache_salt: str = ""  # tenant namespace of the prefix cache (`cache_salt`, vLLM's)
    ended: bool = field(default=False, init=False)  # its final event was sent
    mix: Mix = field(default=BASE, init=False)
    # with aLoRA adapters in the mix (`lora.alora`), set with `mix`: the key of each
    # position span of the prompt, and the scales active from each span's first position
    spans_key: CacheKey | Spans | None = field(default=None, init=False)
    mixes: PositionMixes = field(default=(), init=False)

    @property
    def cache_key(self) -> CacheKey | Spans:
        """The prefix-cache key of the request's mix (per position span with aLoRA), in its
        tenant's namespace (`cache_salt`): KV is shared only within one salt."""
        key = self.mix.cache_key if self.spans_key is None else self.spans_key
        return salted(key, self.cache_salt)


@dataclass
class Submission:
    """What `Engine.submit` returns: the requests (one per prompt, events on each one's
    queue) and ``received``, resolved to their common `Mix` once the engine received them
    (or to the ValueError that refused them: an unknown adapter id, a bad scale)."""

    requests: list[Request]
    received: Future[Mix]


@dataclass
class Run:
    """A request admitted into a slot, until it finishes: its tokens, KV blocks and progress."""

    req: Request
    slot: int
    tokens: list[int]  # prompt + generated
    blocks: list[int] = field(default_factory=list)
    n_computed: int = 0  # tokens whose KV is in `blocks`
    n_cached: int = 0  # prompt tokens reused from the cache
    n_prompt: int = 0
    generated: list[int] = field(default_factory=list)
    sampler: SamplerState | None = None
    timings: Timings = field(default_factory=Timings)
    t_first: float = 0.0
    t_prompt_start: float = 0.0
    pooler: Pooler | None = None  # an embedding request's pooled rows so far
    constraint: Constraint | None = None  # the grammar's state, with `Request.grammar`
    draft: list[int] = field(default_factory=list)  # this step's draft (verified next)
    spec: SpecRun | None = None  # speculation counters and back-off, once it drafts

    @property
    def prefilling(self) -> bool:
        return self.n_computed < self.n_prompt
