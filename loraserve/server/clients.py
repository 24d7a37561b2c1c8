"""Who is calling: each HTTP request's client identity, for the engine's fair admission, and
its tenant, for the prefix cache's isolation (`engine/admission.py`).

A request that carries an API key is that key's client (by digest, never the key itself);
else its peer address's. Under `--cache-isolation key` the key's digest is also the tenant:
a salt of every cache key, so KV is shared only between requests with the same key.
"""

from __future__ import annotations

import hashlib

from starlette.types import Scope

from loraserve.engine.admission import current_client, current_tenant


def bind_client(scope: Scope) -> None:
    """Set `current_client` (and `current_tenant` under `--cache-isolation key`) for the
    HTTP request ``scope`` (called once per request, in its task, before any handler)."""
    from loraserve.server.auth import presented_key  # auth imports errors, errors this

    key = presented_key(scope.get("headers", []))
    digest = hashlib.sha256(key).hexdigest() if key is not None else None
    peer = scope.get("client")
    current_client.set(f"key:{digest[:16]}" if digest else f"peer:{peer[0] if peer else '-'}")
    state = getattr(getattr(scope.get("app"), "state", None), "server", None)
    isolation = getattr(getattr(state, "cfg", None), "cache_isolation", "none")
    current_tenant.set(f"key:{digest}" if isolation == "key" and digest else "")
