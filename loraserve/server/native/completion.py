"""`POST /completion` (alias `/completions`): llama-server's native completion API.

A prompt may be a string, a token list, a mixed list, or a list of prompts (then the
answer is an array of results, each with its `index`). Streaming sends `data: {json}`
events, one per token (`stop: false`), then the full final object with `stop: true`;
no `[DONE]` on this endpoint.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.engine.request import Event
from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import JsonResponse
from loraserve.server.generation import submit, tokenize_prompts
from loraserve.server.native.results import final_result, prob_entry
from loraserve.server.output import Output, collect, progress_timings, stream, token_prob
from loraserve.server.schemas import CompletionRequest
from loraserve.server.state import ServerState, get_state

router = APIRouter()


def pick_fields(res: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama-server's `response_fields`: only the named fields (all when none are named);
    ``a/b`` is the field ``b`` of ``a``, kept under the name ``a/b``; missing ones are left
    out."""
    if not fields:
        return res
    out: dict[str, Any] = {}
    for name in fields:
        value: Any = res
        for part in name.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[name] = value
    return out


def partial_result(
    state: ServerState, out: Output, params: CompletionRequest, index: int, ev: Event
) -> dict[str, Any]:
    """One streamed token event of /completion."""
    res: dict[str, Any] = {
        "index": index,
        "content": ev.text,
        "tokens": [] if ev.token is None else [ev.token],
        "stop": False,
        "id_slot": -1,
        "tokens_predicted": len(out.tokens),
        "tokens_evaluated": len(out.prompt),
    }
    if params.n_probs and ev.probs is not None and ev.token is not None:
        tok = state.require().tokenizer
        res["completion_probabilities"] = [
            prob_entry(tok, ev.token, token_prob(ev), ev.probs, params.post_sampling_probs)
        ]
    return res


@router.post("/completion", openapi_extra=body_doc(CompletionRequest))
@router.post("/completions", openapi_extra=body_doc(CompletionRequest))
async def completion(request: HttpRequest) -> Response:
    """llama-server's completion endpoint (see the module docstring)."""
    state = get_state(request)
    state.require()
    params = await read_body(request, CompletionRequest)
    params = params.with_defaults(state.cfg.request_defaults())
    prompts = await tokenize_prompts(state, params.prompt)
    flight = await submit(state, prompts, params)
    if params.stream:

        def chunk(i: int, out: Output, ev: Event) -> dict[str, Any] | None:
            if ev.done:
                res = final_result(state, out, params, flight.mix, i, ev.text)
                return pick_fields(res, params.response_fields)
            if ev.progress is not None and params.return_progress:
                res = partial_result(state, out, params, i, ev)
                if params.timings_per_token:
                    res["timings"] = progress_timings(ev.progress)
                return {**res, "prompt_progress": ev.progress.as_dict()}
            if ev.token is None:
                return None
            res = partial_result(state, out, params, i, ev)
            if params.timings_per_token:
                res["timings"] = out.partial_timings()
            return res

        return stream(flight, chunk)
    outs = await collect(flight, request)
    results = [
        pick_fields(final_result(state, o, params, flight.mix, i, o.text), params.response_fields)
        for i, o in enumerate(outs)
    ]
    return JsonResponse(results[0] if len(results) == 1 else results)
