"""Service endpoints: `/health`, `/props`, `/tokenize`, `/detokenize`, `/apply-template`.
Slots live in `slots`, adapter endpoints in `lora_api`."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.model.tokenizer import Tokenizer
from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import JsonResponse, invalid_request, json_dumps
from loraserve.server.generation import chat_prompt
from loraserve.server.schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest
from loraserve.server.state import get_state

router = APIRouter()


@router.get("/health")
@router.get("/v1/health")
async def health(request: HttpRequest) -> Response:
    """`{"status": "ok"}`, or 503 `unavailable_error` while the model loads."""
    get_state(request).require()
    return JsonResponse({"status": "ok"})


@router.get("/props")
async def props(request: HttpRequest) -> Response:
    """Server properties: the command line's, plus what the model decides."""
    state = get_state(request)
    engine = state.require()
    assert state.model is not None
    tok = engine.tokenizer
    out = state.cfg.to_props_dict()
    out["default_generation_settings"]["n_ctx"] = engine.n_ctx_slot
    out["model_alias"] = state.model_name
    out["is_sleeping"] = request.app.state.sleep.sleeping
    out["model_path"] = str(state.model.path)
    template = state.template()
    out["chat_template"] = template.source  # a built-in's name, or Jinja text
    out["chat_template_caps"] = template.caps.to_map()  # as llama-server's (`jinja::caps`)
    if template.tool_use:
        out["chat_template_tool_use"] = template.tool_use
    out["bos_token"] = tok.piece(tok.bos_id) if tok.bos_id is not None else ""
    out["eos_token"] = tok.piece(tok.eos_id) if tok.eos_id is not None else ""
    out["lora_loading"] = bool(state.cfg.lora_dirs)  # ours: /lora-adapters/load is served
    return JsonResponse(out)


@router.post("/tokenize", openapi_extra=body_doc(TokenizeRequest))
async def tokenize(request: HttpRequest) -> Response:
    """`{content, add_special, parse_special, with_pieces}` → `{"tokens": [...]}`; with
    pieces each token is `{id, piece}` (a string, or its bytes if not valid UTF-8)."""
    state = get_state(request)
    tok = state.require().tokenizer
    body = await read_body(request, TokenizeRequest)
    return await asyncio.to_thread(_tokenize, tok, body)  # off the event loop: may be large


def _tokenize(tok: Tokenizer, body: TokenizeRequest) -> Response:
    content = body.content
    if isinstance(content, str):
        ids = tok.encode(content, add_special=body.add_special, parse_special=body.parse_special)
    else:
        ids = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                first = body.add_special and i == 0
                ids += tok.encode(part, add_special=first, parse_special=body.parse_special)
            elif part >= tok.vocab_size:
                raise invalid_request(f"content[{i}]: token id {part} is out of the vocabulary")
            else:
                ids.append(part)
    if not body.with_pieces:
        return JsonResponse({"tokens": ids})

    def piece(t: int) -> str | list[int]:
        raw = tok.token_bytes(t)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    # each distinct token's JSON worked out once, the answer joined from them: what
    # `json_dumps` writes, without building (and holding the GIL over) an object per token
    item = {t: json_dumps({"id": t, "piece": piece(t)}) for t in set(ids)}
    body = '{"tokens":[' + ",".join([item[t] for t in ids]) + "]}"
    return Response(body.encode("utf-8", "replace"), media_type="application/json")


@router.post("/detokenize", openapi_extra=body_doc(DetokenizeRequest))
async def detokenize(request: HttpRequest) -> Response:
    """`{tokens}` → `{"content": text}` (token bytes joined, as llama-server)."""
    state = get_state(request)
    tok = state.require().tokenizer
    body = await read_body(request, DetokenizeRequest)

    def run() -> Response:  # off the event loop: may be large
        bad = next((i for i, t in enumerate(body.tokens) if t >= tok.vocab_size), None)
        if bad is not None:
            raise invalid_request(
                f"tokens[{bad}]: token id {body.tokens[bad]} is out of the vocabulary"
            )
        return JsonResponse({"content": tok.decode(body.tokens)})

    return await asyncio.to_thread(run)


@router.post("/apply-template", openapi_extra=body_doc(ApplyTemplateRequest))
async def apply_template(request: HttpRequest) -> Response:
    """`{messages}` → `{"prompt": text}`: the chat template rendered, nothing generated."""
    state = get_state(request)
    state.require()
    body = await read_body(request, ApplyTemplateRequest)
    prompt = await asyncio.to_thread(chat_prompt, state, body)
    return JsonResponse({"prompt": prompt})
