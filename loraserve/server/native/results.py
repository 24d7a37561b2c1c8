"""The native result objects of llama-server's `/completion`: a prompt's final object and
its `completion_probabilities` entries (also the `__verbose` field of OpenAI answers)."""

from __future__ import annotations

from typing import Any

from loraserve.lora.registry import Mix
from loraserve.model.tokenizer import Tokenizer
from loraserve.server.generation import settings
from loraserve.server.output import Output, logprob
from loraserve.server.schemas import _GenerationParams
from loraserve.server.state import ServerState


def prob_entry(
    tok: Tokenizer,
    token: int,
    prob: float | None,
    top: list[tuple[int, float]],
    post: bool,
) -> dict[str, Any]:
    """One element of `completion_probabilities` (llama-server's shape): `logprob` and
    `top_logprobs`, or with `post_sampling_probs` `prob` and `top_probs`."""

    def one(t: int, p: float | None) -> dict[str, Any]:
        d: dict[str, Any] = {"id": t, "token": tok.piece(t), "bytes": list(tok.token_bytes(t))}
        if post:
            d["prob"] = p
        else:
            d["logprob"] = logprob(p)
        return d

    entry = one(token, prob)
    entry["top_probs" if post else "top_logprobs"] = [one(t, p) for t, p in top]
    return entry


def final_result(
    state: ServerState,
    out: Output,
    params: _GenerationParams,
    mix: Mix,
    index: int,
    content: str,
) -> dict[str, Any]:
    """The final /completion object of one prompt."""
    ev = out.final
    assert ev is not None
    tok = state.require().tokenizer
    res: dict[str, Any] = {
        "index": index,
        "content": content,
        "tokens": out.tokens if params.return_tokens and not params.stream else [],
        "id_slot": ev.id_slot,
        "stop": True,
        "model": state.model_name,
        "tokens_predicted": out.n_generated,
        "tokens_evaluated": out.n_prompt,
        "generation_settings": settings(state, params, mix),
        "prompt": tok.decode(out.prompt),
        "has_new_line": "\n" in out.text,
        "truncated": ev.truncated,  # stopped by a full context, as llama-server
        "stop_type": str(ev.stop_type),
        "stopping_word": ev.stopping_word,
        "tokens_cached": ev.n_cached,
        "timings": out.timings(),
    }
    if params.n_probs and not params.stream:
        post = params.post_sampling_probs
        res["completion_probabilities"] = [
            prob_entry(tok, t, p, top, post) for t, p, top in out.probs
        ]
    return res
