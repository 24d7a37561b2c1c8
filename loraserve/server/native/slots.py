"""Slot endpoints: `GET /slots` and `POST /slots/{id}?action=save|restore|erase`.

Under `--cache-isolation key` (issue 31 item 6) a slot belongs to the API key whose sequence
it holds: the key of its last request, or of the key that restored it since (a restore
clears the slot's last request on the engine thread, so a request racing it is never
mistaken for its owner). Another key sees the slot only as llama-server shows an idle one
that has run nothing (`n_tokens` 0, `is_processing` false, no task fields: not even whether
another key is using it; `fail_on_no_slot` still answers from every slot, a capacity signal
as a full queue's 503 is), cannot save or erase it (the answer would carry its token count),
and slot files carry their key: another key's file is a file that does not exist. A slot
file saved without the flag belongs to no key: under the flag it is refused with a 400 that
says so (restore it on a server without the flag), and a file saved under the flag is
refused the same way on a server without it. Slot actions on one slot run one at a time.
Without the flag every key sees everything, as llama-server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from safetensors import safe_open
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.cache.block_pool import OutOfBlocks
from loraserve.engine import slot_io
from loraserve.engine.admission import current_tenant
from loraserve.engine.request import Request
from loraserve.engine.views import SlotView
from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import (
    JsonResponse,
    invalid_request,
    not_found,
    not_supported,
    unavailable,
)
from loraserve.server.flight import wait
from loraserve.server.offload import io_thread
from loraserve.server.state import ServerState, get_state

router = APIRouter()
FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
OWNER = "owner"  # the fingerprint entry naming a slot file's tenant (`--cache-isolation key`)
UNKEYED = "is a slot file saved without --cache-isolation key"


class SlotFileRequest(BaseModel):
    """Body of a slot save or restore: a file name inside `--slot-save-path`."""

    model_config = ConfigDict(strict=True, extra="ignore")
    filename: str = Field(min_length=1)


def tenant_of(req: Request) -> str:
    """The tenant (`--cache-isolation key`: its key's) of a request: its salt's first part."""
    return req.cache_salt.split("\x00", 1)[0]


def holder(state: ServerState, slot: SlotView) -> str | None:
    """The tenant whose sequence ``slot`` holds: '' for none, None when not known."""
    last = slot.request.id if slot.request is not None else None
    restored = state.slot_restores.get(slot.id)
    if restored is not None and restored[1] == last:  # restored, no request since
        return restored[0]
    if slot.n_tokens == 0 and not slot.busy:
        return ""
    return tenant_of(slot.request) if slot.request is not None else None


def slot_json(
    n_ctx: int,
    slot: SlotView,
    speculative: bool = False,
    tenant: str = "",
    owner: str | None = "",
) -> dict[str, Any]:
    """One slot as llama-server shows it: the task fields (`id_task`, `params`,
    `next_token`) only once the slot has run a request. Under `--cache-isolation key`
    (``tenant``: the caller's) the request's fields only to its own key, and `n_tokens` only
    to the key whose sequence the slot holds (``owner``, from `holder`)."""
    mine = not tenant or owner in (tenant, "")
    out: dict[str, Any] = {
        "id": slot.id,
        "n_ctx": n_ctx,
        "speculative": speculative,  # as llama-server: whether the slot can speculate
        "is_processing": slot.busy and mine,
        "n_tokens": slot.n_tokens if mine else 0,
    }
    req = slot.request
    if req is None or (tenant and tenant_of(req) != tenant):
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
                "n_decoded": slot.n_decoded if mine else 0,
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
    views = await wait(engine.slots())
    infos = [slot_json(engine.n_ctx_slot, s, spec, tenant, holder(state, s)) for s in views]
    if fail_on_no_slot and all(s.busy for s in views):
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


def _slot_lock(state: ServerState, id_slot: int) -> asyncio.Lock:
    """The lock one slot's actions take in turn (a restore and its owner's record, a save
    between its two ownership checks, an erase)."""
    return state.slot_locks.setdefault(id_slot, asyncio.Lock())


def file_owner(path: Path) -> str | None:
    """The tenant a slot file of ours was saved by ('' none; None: not a slot file)."""
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != slot_io.FORMAT:
            return None
        fp = json.loads(meta.get("fingerprint", "null"))
        return str(fp.get(OWNER, "")) if isinstance(fp, dict) else ""
    except Exception:  # safetensors raises its own types on other files
        return None


async def _last_request(state: ServerState, id_slot: int) -> int | None:
    """The id of the slot's running or last request (None: it has run none)."""
    view = (await wait(state.require().slots()))[id_slot]
    return view.request.id if view.request is not None else None


async def _own_slot(state: ServerState, id_slot: int, tenant: str) -> int | None:
    """Under key isolation: the id of the slot's last request if ``tenant`` may save or
    erase it (it holds nothing, or this tenant's sequence); else a 400."""
    view = (await wait(state.require().slots()))[id_slot]
    if holder(state, view) not in ("", tenant):
        raise invalid_request(
            f"id_slot: slot {id_slot} holds another API key's sequence "
            "(--cache-isolation key: a key saves and erases only its own slots)"
        )
    return view.request.id if view.request is not None else None


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
    tenant = current_tenant.get()  # '' unless --cache-isolation key
    async with _slot_lock(state, id_slot):
        return await _act(state, request, id_slot, action, tenant)


async def _act(
    state: ServerState, request: HttpRequest, id_slot: int, action: str, tenant: str
) -> Response:
    """`slot_action` under the slot's lock (``tenant``: '' unless --cache-isolation key)."""
    engine = state.require()
    t0 = time.perf_counter()
    if action == "erase":
        if tenant:
            await _own_slot(state, id_slot, tenant)
        n = await wait(engine.erase_slot(id_slot))
        state.slot_restores.pop(id_slot, None)
        return JsonResponse({"id_slot": id_slot, "n_erased": n})
    if action not in ("save", "restore"):
        raise invalid_request(f"action: expected save, restore or erase, got {action!r}")
    filename = (await read_body(request, SlotFileRequest)).filename
    fp = await asyncio.to_thread(engine.slot_fingerprint)  # hashes the weights once
    if tenant:
        fp = {**fp, OWNER: tenant}
    if action == "save":
        path = _slot_path(state, filename, must_exist=False)
        if tenant:
            last = await _own_slot(state, id_slot, tenant)
            owner = await io_thread(file_owner, path)
            if owner == "":
                raise invalid_request(f"filename: {filename!r} {UNKEYED}: not a key's to replace")
            if owner not in (None, tenant):
                raise invalid_request(f"filename: {filename!r} is another API key's slot file")
        image = await wait(engine.save_slot(id_slot))
        if tenant and await _own_slot(state, id_slot, tenant) != last:
            raise unavailable(f"slot {id_slot} ran another request meanwhile: save again")
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
    owner = await io_thread(file_owner, path)
    if tenant and owner == "":
        raise invalid_request(
            f"filename: {filename!r} {UNKEYED}: it belongs to no API key, so none restores "
            "it here (restore it on a server started without --cache-isolation key)"
        )
    if tenant and owner not in (None, tenant):
        raise not_found(f"filename: no slot file {filename!r}")  # as if it did not exist
    if not tenant and owner:
        raise invalid_request(
            f"filename: {filename!r} was saved under --cache-isolation key by one API key: "
            "restore it on a server with that flag, with that key"
        )
    try:
        image = await io_thread(slot_io.read, path, fp, engine.n_ctx_slot)
        n = await wait(engine.restore_slot(id_slot, image))
    except slot_io.SlotFileError as e:
        raise invalid_request(str(e)) from None
    except OutOfBlocks:
        raise unavailable("not enough free KV blocks to restore the slot") from None
    # the restore cleared the slot's last request on the engine thread: still none, no
    # request has run in the slot since (one that did holds it now, and is its owner)
    if tenant and await _last_request(state, id_slot) is None:
        state.slot_restores[id_slot] = (tenant, None)
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
