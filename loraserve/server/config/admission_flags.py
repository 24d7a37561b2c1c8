"""Admission and tenant flags (ours, not llama-server's): `--max-queue` bounds the requests
waiting for a slot (past it a 503 with `Retry-After`, `engine/admission.py`),
`--max-connections` the open HTTP connections (uvicorn's `limit_concurrency`),
`--preempt-after` how long a request may wait for a slot before it takes one from a request
that has held its own that long (`engine/preemption.py`), and
`--cache-isolation key` makes each API key a tenant of its own in the prefix cache (as a
`cache_salt` per key: a client never reuses, nor learns of, another key's prompts)."""

from __future__ import annotations

import argparse
from typing import Any

from loraserve.server.config.arg_types import float_in, int_in

DEFAULT_MAX_QUEUE = 1024  # requests waiting for a slot; 0 = unbounded
DEFAULT_MAX_CONNECTIONS = 1024  # open HTTP connections (and requests in progress); 0 = unbounded
DEFAULT_PREEMPT_AFTER_S = 30.0  # seconds a request waits for a busy slot; 0 = never preempt
ISOLATION = ("none", "key")


def add_flags(p: argparse.ArgumentParser) -> None:
    """Register the admission flags (their defaults come from `ServerConfig`)."""
    g = p.add_argument_group("admission and tenants")
    a = g.add_argument
    a(
        "--max-queue",
        type=int_in(0),
        metavar="N",
        help="requests waiting for a slot at most; past it a request is refused at once "
        f"with 503 and Retry-After, 0 = unbounded (default: {DEFAULT_MAX_QUEUE})",
    )
    a(
        "--max-connections",
        type=int_in(0),
        metavar="N",
        help="open HTTP connections at most (idle keep-alive ones included); past it a request "
        f"is answered 503 at once, 0 = unbounded (default: {DEFAULT_MAX_CONNECTIONS})",
    )
    a(
        "--preempt-after",
        dest="preempt_after_s",
        type=float_in(0),
        metavar="SECONDS",
        help="a request that waited this long with every slot busy takes a slot from a request "
        "that has held its own as long; that one resumes later, answering exactly as it would "
        f"have, 0 = never (default: {DEFAULT_PREEMPT_AFTER_S:g})",
    )
    a(
        "--cache-isolation",
        choices=ISOLATION,
        help="key: the prefix cache is shared only between requests with the same API key "
        "(each key a tenant, as a cache_salt); none: shared by all, a request's cache_salt "
        "aside (default: none)",
    )


def config(ns: argparse.Namespace) -> dict[str, Any]:
    """The `ServerConfig` values of the admission flags."""
    return {
        "max_queue": ns.max_queue,
        "max_connections": ns.max_connections,
        "preempt_after_s": ns.preempt_after_s,
        "cache_isolation": ns.cache_isolation,
    }
