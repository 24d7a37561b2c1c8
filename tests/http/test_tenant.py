"""Tenant isolation in the prefix cache (issue 31 item 6), as vLLM's `cache_salt`: a request's
salt, and its API key under `--cache-isolation key`, are part of its cache key, so KV is
shared only within a tenant and `tokens_cached` (`timings.cache_n`) can't be used to probe
another tenant's prompt; the answers themselves are the same whatever the tenant.

Over HTTP on the tiny model, and a hypothesis property test on the prefix cache: under
random runs of several tenants (sharing prompts and adapter keys), no match ever returns a
block that another tenant's sequence computed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraserve.cache.block_pool import BlockPool
from loraserve.cache.prefix_cache import PrefixCache, salted, spans
from tests.server_util import Served, serve_in_thread

SECRET = "the of and to in is it that was for on are as with his they the cat sat"
KEYS = ("tenant-one", "tenant-two")


def ask(srv: Served, prompt: str, key: str | None = None, **extra: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"prompt": prompt, "n_predict": 3, "temperature": 0, **extra}
    r = srv.client.post("/completion", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def srv() -> Iterator[Served]:
    with serve_in_thread(["-np", "2", "-c", "512"]) as s:
        yield s


@pytest.fixture(scope="module")
def keyed() -> Iterator[Served]:
    args = ["-np", "2", "-c", "512", "--cache-isolation", "key"]
    with serve_in_thread([*args, "--api-key", KEYS[0], "--api-key", KEYS[1]]) as s:
        yield s


def probe(srv: Served, guess: str, **kw: Any) -> int:
    """What a guess reveals: its `tokens_cached` (the same as `timings.cache_n` here)."""
    out = ask(srv, guess, **kw)
    assert out["timings"]["cache_n"] <= out["tokens_cached"]
    return out["tokens_cached"]


def test_cache_salt_separates_tenants(srv: Served) -> None:
    victim = ask(srv, SECRET, cache_salt="victim")
    assert victim["tokens_cached"] == 0
    # the attacker's guesses, one token longer each time (each in a fresh tenant, so its own
    # earlier guesses are not what it finds): nothing the victim computed is ever reused
    words = SECRET.split()
    for n in range(1, len(words) + 1):
        assert probe(srv, " ".join(words[:n]), cache_salt=f"attacker{n}") == 0
    # no salt is a tenant of its own too
    assert probe(srv, SECRET + " x") == 0
    # within the victim's tenant the prefix is reused, and answers never depend on it
    again = ask(srv, SECRET, cache_salt="victim")
    assert again["tokens_cached"] > 0
    assert again["content"] == victim["content"]
    assert ask(srv, SECRET, cache_salt="other")["content"] == victim["content"]


def test_cache_salt_is_validated(srv: Served) -> None:
    for bad in ("", "x" * 5000, 5):
        r = srv.client.post("/completion", json={"prompt": "x", "cache_salt": bad})
        assert r.status_code == 400 and "cache_salt" in r.json()["error"]["message"], bad


def test_api_keys_are_tenants_under_cache_isolation_key(keyed: Served) -> None:
    first = ask(keyed, SECRET, KEYS[0])
    words = SECRET.split()
    assert probe(keyed, SECRET, key=KEYS[1]) == 0  # the other key's tenant: nothing
    assert probe(keyed, " ".join(words[:4]), key=KEYS[1], cache_salt="fresh") == 0
    mine = ask(keyed, SECRET, KEYS[0])
    assert mine["tokens_cached"] > 0 and mine["content"] == first["content"]
    # a salt inside a key's tenant: a tenant of its own again
    assert probe(keyed, SECRET, key=KEYS[0], cache_salt="sub") == 0


def test_chat_requests_take_a_salt(srv: Served) -> None:
    msgs = [{"role": "user", "content": SECRET}]
    body = {"messages": msgs, "max_tokens": 2, "temperature": 0, "cache_salt": "chat-a"}
    one = srv.client.post("/v1/chat/completions", json=body).json()
    two = srv.client.post("/v1/chat/completions", json={**body, "cache_salt": "chat-b"}).json()
    three = srv.client.post("/v1/chat/completions", json=body).json()
    cached = [
        r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        for r in (one, two, three)
    ]
    assert cached[0] == 0 and cached[1] == 0 and cached[2] > 0
    assert one["choices"][0]["message"] == two["choices"][0]["message"]


# -- the property: no block is reused across salts -----------------------------------------

BS = 4
ADAPTER_KEYS = [(), (("adapterA", 1.0),), spans([(0, ()), (5, (("alora", 1.0),))])]
SALTS = ["", "a", "b", "a\x00b"]
PROMPT = st.lists(st.integers(0, 3), min_size=1, max_size=14)
RUN = st.tuples(st.sampled_from(SALTS), st.integers(0, len(ADAPTER_KEYS) - 1), PROMPT)


@settings(max_examples=150, deadline=None)
@given(st.lists(RUN, min_size=1, max_size=25), st.sampled_from([None, 0, 3]))
def test_no_block_is_reused_across_salts(runs, budget) -> None:
    pool = BlockPool(BS, 64, initial_blocks=64)
    cache = PrefixCache(pool, budget)
    owner: dict[int, str] = {}  # block -> the tenant whose sequence computed its KV
    for salt, k, prompt in runs:
        key = salted(ADAPTER_KEYS[k], salt)
        m = cache.match(key, prompt, len(prompt) - 1)
        for b in m.blocks + ([m.partial_block] if m.partial_block is not None else []):
            assert owner[b] == salt, "a block of another tenant was matched"
        for b in m.blocks:
            cache.acquire(b)
        blocks = list(m.blocks)
        while len(blocks) * BS < len(prompt):
            b = cache.allocate()
            owner[b] = salt  # computed (or copied from this tenant's partial) by this run
            blocks.append(b)
        cache.insert(key, prompt, blocks)
        cache.release(blocks)
        cache.check()


def test_slots_show_a_request_only_to_its_tenant(keyed: Served) -> None:
    """Under `--cache-isolation key`, `/slots` shows a slot's last request (its params: stop
    strings, grammar, biases) only to that request's key; another key sees the slot as one
    that has run nothing (llama-server's shape for it)."""
    ask(keyed, SECRET, KEYS[0], stop=["secret-stop-word"])

    def slots(key: str) -> list[dict[str, Any]]:
        r = keyed.client.get("/slots", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
        return r.json()

    mine = [s for s in slots(KEYS[0]) if "params" in s]
    assert any(s["params"]["stop"] == ["secret-stop-word"] for s in mine)
    theirs = slots(KEYS[1])
    assert len(theirs) == len(mine + [s for s in slots(KEYS[0]) if "params" not in s])
    assert "secret-stop-word" not in json.dumps(theirs)
