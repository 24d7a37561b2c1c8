"""From a validated request body to a `Flight` of engine requests: tokenization, limits,
sampling settings and the submission (the engine fixes the adapter mix at receipt), and
the `generation_settings` the answer reports.

Shared by the llama-server (`completion`) and OpenAI (`oai`) endpoints; their output goes
through `output`. A chat request's prompt is `chat_prompt`'s (re-exported here).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

from loraserve.engine.request import Submission
from loraserve.engine.sampling.params import SamplingParams
from loraserve.lora.registry import Mix, UnknownModelName
from loraserve.model.tokenizer import Tokenizer
from loraserve.server.chat_prompt import chat_prompt
from loraserve.server.errors import (
    ApiError,
    exceed_context_size,
    invalid_request,
    not_found,
    server_error,
)
from loraserve.server.fields import MAX_LOGIT_BIAS
from loraserve.server.flight import Flight, wait
from loraserve.server.grammar import AnswerConstraint, request_grammar
from loraserve.server.schemas import Prompt, _GenerationParams
from loraserve.server.state import ServerState

log = logging.getLogger("loraserve.server")
T = TypeVar("T")
BIG_PROMPT_CHARS = 20_000  # longer prompts are tokenized off the event loop


def tokenize_prompt(tok: Tokenizer, prompt: Prompt) -> list[int]:
    """llama-server's tokenization of a prompt: a string gets BOS (as the vocabulary asks)
    and special tokens parsed; in a mixed list only a leading string gets BOS."""
    if isinstance(prompt, str):
        return tok.encode(prompt, add_special=True, parse_special=True)
    out: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            out += tok.encode(part, add_special=i == 0, parse_special=True)
        else:
            out.append(part)
    return out


def prompt_chars(prompt: Prompt) -> int:
    """What tokenizing a prompt costs, in characters: a string's length; in a list, each
    string's length and 8 per token id."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(x) if isinstance(x, str) else 8 for x in prompt)


async def off_loop(fn: Callable[[], T], size: int) -> T:
    """``fn()``, in a worker thread when ``size`` (characters to tokenize) is large enough
    to hold the event loop up: other clients (`/health`) are answered meanwhile."""
    return await asyncio.to_thread(fn) if size > BIG_PROMPT_CHARS else fn()


async def tokenize_prompts(state: ServerState, prompts: list[Prompt]) -> list[list[int]]:
    """Tokenize and check every prompt: token ids in the vocabulary, not empty, and
    shorter than a slot's context (else 400 `exceed_context_size_error`)."""
    engine = state.require()
    tok = engine.tokenizer

    def run() -> list[list[int]]:
        out = [tokenize_prompt(tok, p) for p in prompts]
        where = (lambda i: f"prompt[{i}]") if len(out) > 1 else (lambda i: "prompt")
        for i, ids in enumerate(out):
            check_tokens(state, ids, where(i))
        return out

    return await off_loop(run, sum(prompt_chars(p) for p in prompts))


def check_tokens(state: ServerState, ids: list[int], where: str) -> None:
    """A prompt the engine can run: non-empty, ids < vocab, fits a slot's context."""
    engine = state.require()
    vocab = engine.tokenizer.vocab_size
    if not ids:
        raise invalid_request(f"{where}: the prompt is empty (no tokens)")
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise invalid_request(f"{where}: token id {bad} is out of the vocabulary [0, {vocab})")
    if len(ids) >= engine.n_ctx_slot:
        raise exceed_context_size(len(ids), engine.n_ctx_slot)


def logit_bias(state: ServerState, params: _GenerationParams) -> list[tuple[int, float]]:
    """The request's `logit_bias` by token id: a token text's bias goes to every token it
    tokenizes to (without special tokens, as llama-server); at most MAX_LOGIT_BIAS entries
    after tokenizing (a 400 past it). Tokenized once per request (kept on ``params``)."""
    if params._bias_ids is not None:
        return list(params._bias_ids)
    tok = state.require().tokenizer
    out: list[tuple[int, float]] = []
    for t, bias in params.logit_bias:
        ids = [t] if isinstance(t, int) else tok.encode(t, add_special=False, parse_special=False)
        out += [(i, bias) for i in ids]
        if len(out) > MAX_LOGIT_BIAS:
            raise invalid_request(
                f"logit_bias: its token texts tokenize to more than {MAX_LOGIT_BIAS} tokens"
            )
    params._bias_ids = out
    return list(out)


def sampling_params(state: ServerState, params: _GenerationParams) -> SamplingParams:
    """The engine's sampling settings; a 400 naming the field if they do not fit the model."""
    kwargs = params.sampling_kwargs()
    kwargs["logit_bias"] = tuple(logit_bias(state, params))
    sp = SamplingParams(**kwargs)
    try:
        sp.validate(state.require().tokenizer.vocab_size)
    except ValueError as e:
        raise invalid_request(str(e)) from None
    return sp


def bias_text_chars(params: _GenerationParams) -> int:
    """Characters of `logit_bias` token texts: what tokenizing them costs."""
    return sum(len(t) for t, _ in params.logit_bias if isinstance(t, str))


def check_limits(state: ServerState, params: _GenerationParams) -> None:
    """`id_slot` an existing slot, `n` at most the slots (as llama-server). An `n_predict`
    beyond a slot's context is fine: generation stops when the context is full."""
    engine = state.require()
    n_slots = engine.n_slots
    if params.n > n_slots:
        raise invalid_request(
            f"n: at most {n_slots} completions per request (the number of slots, -np), "
            f"got {params.n}"
        )
    if params.id_slot >= n_slots:
        raise invalid_request(f"id_slot: no slot {params.id_slot} (slots are 0..{n_slots - 1})")


async def submit(
    state: ServerState,
    prompts: list[list[int]],
    params: _GenerationParams,
    adapter_name: str | None = None,
    progress: bool = False,
    grammar: AnswerConstraint | None = None,
) -> Flight:
    """Submit `n` engine requests per prompt under one effective adapter mix (the engine
    resolves it at receipt: `Engine.submit`); a 400 naming `lora` if it refuses it.
    `adapter_name` is an OpenAI `model`: the model's own name (or alias) is no adapter's.
    Prompt-progress events come with `progress`, or a stream asking for `return_progress`
    or `timings_per_token`. `grammar`: what constrains the answer in place of the request's
    constraint fields (a chat answer's plan: its tool-call grammar and reasoning budget,
    `server/tool_calls.py`)."""
    if adapter_name is not None and state.names_the_model(adapter_name):
        adapter_name = None
    check_limits(state, params)
    if bias_text_chars(params) > BIG_PROMPT_CHARS // 10:  # tokenized off the event loop
        sp = await asyncio.to_thread(sampling_params, state, params)
    else:
        sp = sampling_params(state, params)
    if grammar is None:
        text = await request_grammar(
            state, params.grammar, params.json_schema, params.response_format
        )
        grammar = AnswerConstraint(text)
    scales = params.lora_scales()  # None: the global scales
    sub = state.require().submit(
        prompts,
        sp,
        max_tokens=params.n_predict,
        stop=params.stop,
        lora=list(scales.items()) if scales is not None else None,
        adapter_name=adapter_name,
        cache_prompt=params.cache_prompt,
        id_slot=params.id_slot,
        grammar=grammar.grammar,
        reasoning_budget=grammar.budget,
        spec=params.speculative(),
        n=params.n,
        strict_name=state.cfg.strict_model_names,
        progress=progress or params.stream and (params.return_progress or params.timings_per_token),
        cache_salt=params.cache_salt or "",
    )
    flight = await start_flight(state, sub)
    if adapter_name is not None and flight.mix.named is None:
        state.warn_unknown_model(adapter_name)
    return flight


async def start_flight(state: ServerState, sub: Submission) -> Flight:
    """Follow a submission's requests with a `Flight` once the engine received them (a
    400 naming `lora` if it refused their mix)."""
    flight = state.flights.start(state.require(), sub.requests)
    try:
        flight.mix = await wait(sub.received)
    except UnknownModelName as e:
        flight.close()
        raise not_found(str(e)) from None
    except ValueError as e:
        flight.close()
        raise invalid_request(f"lora: {e}") from None
    except ApiError:
        flight.close()
        raise
    except Exception as e:  # the engine could not take this request: it alone fails
        flight.close()
        log.error("request %s not received: %r", [r.id for r in sub.requests], e, exc_info=e)
        raise server_error(
            f"internal error receiving the request: {type(e).__name__}: {e}"
        ) from None
    except BaseException:
        flight.close()
        raise
    return flight


def settings(state: ServerState, params: _GenerationParams, mix: Mix) -> dict:
    """`generation_settings`: the request's parameters, with the effective `lora` mix."""
    out: dict[str, Any] = {
        k: getattr(params, k)
        for k in (
            "n_predict seed temperature top_k top_p min_p repeat_last_n repeat_penalty"
            " presence_penalty frequency_penalty stop ignore_eos stream n_probs"
            " post_sampling_probs cache_prompt id_slot return_tokens"
        ).split()
    }
    out["max_tokens"] = params.n_predict
    # llama-server's shape; ignore_eos shows as a -inf bias (null) on every end-of-generation token
    bias = logit_bias(state, params)
    if params.ignore_eos:
        bias += [(t, -math.inf) for t in sorted(state.require().eog_ids)]
    out["logit_bias"] = [{"bias": b, "token": t} for t, b in bias]
    out["n_ctx"] = state.require().n_ctx_slot
    out["lora"] = [{"id": i, "scale": s} for i, s in sorted(mix.scales.items())]
    spec = state.cfg.spec
    out["speculative.types"] = ",".join(spec.types) or "none"
    out["speculative.n_max"] = spec.draft_n_max if params.spec_n_max is None else params.spec_n_max
    out["speculative.n_min"] = spec.draft_n_min if params.spec_n_min is None else params.spec_n_min
    out["speculative.p_min"] = spec.draft_p_min if params.spec_p_min is None else params.spec_p_min
    return out


__all__ = ["chat_prompt"]  # re-exported: its importers read it here
