"""Service endpoints: `/health`, `/props`, `/slots` (and slot save/restore/erase),
`/tokenize`, `/detokenize`, `/apply-template`. Adapter endpoints live in `lora_api`."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.cache.block_pool import OutOfBlocks
from loraserve.engine import slot_io
from loraserve.engine.admission import current_tenant
from loraserve.engine.views import SlotView
from loraserve.model.tokenizer import Tokenizer
from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import (
    JsonResponse,
    invalid_request,
    json_dumps,
    not_found,
    not_supported,
    unavailable,
)
from loraserve.server.flight import wait
from loraserve.server.generation import chat_prompt
from loraserve.server.offload import io_thread
from loraserve.server.schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest
from loraserve.server.state import ServerState, get_state

router = APIRouter()
FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")


class SlotFileRequest(BaseModel):
    """Body of a slot save or restore: a file name inside `--slot-save-path`."""

    model_config = ConfigDict(strict=True, extra="ignore")
    filename: str = Field(min_length=1)


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


def _slot_json(
    n_ctx: int, slot: SlotView, speculative: bool = False, tenant: str = ""
) -> dict[str, Any]:
    """One slot as llama-server shows it: the task fields (`id_task`, `params`,
    `next_token`) only once the slot has run a request, and (ours) under `--cache-isolation
    key` only to that request's tenant (`tenant`: the caller's): another key's stop strings,
    grammar or biases are not shown, as its prompt is not (issue 31 item 6)."""
    out: dict[str, Any] = {
        "id": slot.id,
        "n_ctx": n_ctx,
        "speculative": speculative,  # as llama-server: whether the slot can speculate
        "is_processing": slot.busy,
        "n_tokens": slot.n_tokens,
    }
    req = slot.request
    if req is None or (tenant and req.cache_salt.split("\x00", 1)[0] != tenant):
        return out
    params = dataclasses.asdict(req.sampling)
    params["logit_bias"] = [list(x) for x in req.sampling.logit_bias]
    params.update(
        n_predict=req.max_tokens,
        stop=list(req.stop),
        cache_prompt=req.cache_prompt,
        lora=[{"id": i, "scale": s} for i, s in sorted(req.mix.scales.items())],
    )
    return {
        **out,
        "id_task": req.id,
        "params": params,
        "next_token": [  # a list, as llama-server's (one entry per sequence of the slot)
            {
                "has_next_token": slot.busy,
                "n_remain": (req.max_tokens - slot.n_decoded)
                if slot.busy and req.max_tokens >= 0
                else -1,
                "n_decoded": slot.n_decoded,
            }
        ],
    }


@router.get("/slots")
async def slots(request: HttpRequest, fail_on_no_slot: int = 0) -> Response:
    """Each slot's id, context, whether it is processing, and its last request's params
    (501 with `--no-slots`)."""
    state = get_state(request)
    engine = state.require()
    if not state.cfg.slots:
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    spec = state.cfg.spec.enabled
    tenant = current_tenant.get()  # '' unless --cache-isolation key
    infos = [_slot_json(engine.n_ctx_slot, s, spec, tenant) for s in await wait(engine.slots())]
    if fail_on_no_slot and all(s["is_processing"] for s in infos):
        raise unavailable("no slot available")
    return JsonResponse(infos)


def _slot_path(state: ServerState, filename: str, must_exist: bool) -> Path:
    if not FILENAME.fullmatch(filename):
        raise invalid_request(
            "filename: use 1-255 characters of A-Z a-z 0-9 . _ - (not starting with . or -)"
        )
    root = Path(os.path.realpath(state.cfg.slot_save_path or "."))
    path = root / filename
    if must_exist:
        real = Path(os.path.realpath(path))
        if real.parent != root or not real.is_file():
            raise not_found(f"filename: no slot file {filename!r}")
        return real
    return path


@router.post("/slots/{id_slot}", openapi_extra=body_doc(SlotFileRequest, required=False))
async def slot_action(request: HttpRequest, id_slot: int, action: str = "") -> Response:
    """`?action=save|restore` (body `{"filename"}`) or `?action=erase` on an idle slot."""
    state = get_state(request)
    engine = state.require()
    if state.cfg.slot_save_path is None:
        raise not_supported(
            "This server does not support slots action. Start it with `--slot-save-path`"
        )
    if not 0 <= id_slot < engine.n_slots:
        raise invalid_request(f"id_slot: no slot {id_slot}")
    t0 = time.perf_counter()
    if action == "erase":
        n = await wait(engine.erase_slot(id_slot))
        return JsonResponse({"id_slot": id_slot, "n_erased": n})
    if action not in ("save", "restore"):
        raise invalid_request(f"action: expected save, restore or erase, got {action!r}")
    filename = (await read_body(request, SlotFileRequest)).filename
    fp = await asyncio.to_thread(engine.slot_fingerprint)  # hashes the weights once
    if action == "save":
        path = _slot_path(state, filename, must_exist=False)
        image = await wait(engine.save_slot(id_slot))
        try:
            mib = state.cfg.slot_save_max_mib
            budget = mib * 2**20 if mib >= 0 else -1
            n_written = await io_thread(slot_io.write, path, image, fp, budget)
        except slot_io.SlotFileError as e:
            raise invalid_request(str(e)) from None
        ms = (time.perf_counter() - t0) * 1000
        return JsonResponse(
            {
                "id_slot": id_slot,
                "filename": filename,
                "n_saved": len(image.tokens),
                "n_written": n_written,
                "timings": {"save_ms": ms},
            }
        )
    path = _slot_path(state, filename, must_exist=True)
    try:
        image = await io_thread(slot_io.read, path, fp, engine.n_ctx_slot)
        n = await wait(engine.restore_slot(id_slot, image))
    except slot_io.SlotFileError as e:
        raise invalid_request(str(e)) from None
    except OutOfBlocks:
        raise unavailable("not enough free KV blocks to restore the slot") from None
    ms = (time.perf_counter() - t0) * 1000
    return JsonResponse(
        {
            "id_slot": id_slot,
            "filename": filename,
            "n_restored": n,
            "n_read": path.stat().st_size,
            "timings": {"restore_ms": ms},
        }
    )


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
