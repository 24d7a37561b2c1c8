"""Two tenants' API keys and the slot requests the per-tenant slot tests make: list a key's
slots, act on one (save, restore, erase), find the slot a key's request used."""

from __future__ import annotations

from typing import Any

from tests.server_util import Served

SECRET = "the of and to in is it that was for on are as with his they the cat sat"


KEYS = ("tenant-one", "tenant-two")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def slots(srv: Served, key: str) -> list[dict[str, Any]]:
    r = srv.client.get("/slots", headers=auth(key))
    assert r.status_code == 200, r.text
    return r.json()


def action(srv: Served, key: str, slot: int, what: str, filename: str = "") -> Any:
    body = {"filename": filename} if filename else None
    return srv.client.post(f"/slots/{slot}?action={what}", json=body, headers=auth(key))


def used_slot(srv: Served, key: str) -> int:
    """The slot holding ``key``'s sequence (as that key sees it)."""
    held = [s["id"] for s in slots(srv, key) if s["n_tokens"] > 0]
    assert len(held) == 1, slots(srv, key)
    return held[0]
