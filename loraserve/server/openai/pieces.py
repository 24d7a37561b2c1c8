"""The pieces of OpenAI answers, shared by `/v1/completions` and `/v1/chat/completions`
(`openai.endpoints`): object heads, `usage`, logprobs and finish reasons."""

from __future__ import annotations

from typing import Any

from loraserve import __version__
from loraserve.model.tokenizer import Tokenizer
from loraserve.server.output import Output, logprob

FINISH = {"eos": "stop", "word": "stop", "limit": "length", "none": "stop"}
FINGERPRINT = f"loraserve-{__version__}"


def usage(outs: list[Output], n: int = 1) -> dict[str, Any]:
    """OpenAI `usage`, with the reused prompt tokens as `prompt_tokens_details.cached_tokens`;
    with `n` choices per prompt (prompt-major), each prompt counts once."""
    prompt = sum(o.n_prompt for o in outs[::n])
    completion = sum(o.n_generated for o in outs)
    cached = sum(o.final.n_cached for o in outs[::n] if o.final is not None)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def object_head(kind: str, cid: str, created: int, model: str) -> dict[str, Any]:
    """The fields every OpenAI response object and chunk starts with."""
    return {
        "id": cid,
        "object": kind,
        "created": created,
        "model": model,
        "system_fingerprint": FINGERPRINT,
    }


def text_logprobs(tok: Tokenizer, out: Output) -> dict[str, Any]:
    """`/v1/completions` logprobs: tokens, their logprobs, top alternatives, text offsets."""
    tokens, lps, tops, offsets, pos = [], [], [], [], 0
    for t, p, top in out.probs:
        piece = tok.piece(t)
        tokens.append(piece)
        lps.append(logprob(p))
        tops.append({tok.piece(c): logprob(q) for c, q in top})
        offsets.append(pos)
        pos += len(piece)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tok: Tokenizer, probs: list[tuple[int, float | None, list]]) -> dict:
    """`/v1/chat/completions` logprobs: per token its piece, logprob, bytes, alternatives."""

    def one(t: int, p: float | None) -> dict[str, Any]:
        return {"token": tok.piece(t), "logprob": logprob(p), "bytes": list(tok.token_bytes(t))}

    return {
        "content": [
            {**one(t, p), "top_logprobs": [one(c, q) for c, q in top]} for t, p, top in probs
        ]
    }


def finish_reason(out: Output, calls: bool = False) -> str:
    """OpenAI `finish_reason` of a finished output; as llama-server's, "tool_calls" when it
    has ``calls`` and stopped at an end token or a stop word (a cut answer is "length")."""
    assert out.final is not None
    reason = FINISH.get(str(out.final.stop_type), "stop")
    return "tool_calls" if calls and reason == "stop" else reason
