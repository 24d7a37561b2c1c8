"""Bounded-load affinity of `loraserve ray` (`cluster.routing.Balancer`), without a cluster:
four adapter configurations on two replicas land two and two (plain rendezvous hashing
put all four of issue 29's workload on one replica), any K configurations on R replicas
at most ceil(K / R) each under equal traffic (weighted by recent traffic otherwise: a hot
one counts for more), a configuration keeps its replica while it is active, and the
configurations of a replica that left, or that went quiet, are placed again."""

from __future__ import annotations

import math
from collections import Counter

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install -e '.[ray]'")

from loraserve.cluster.routing import Balancer, rank  # noqa: E402


def place(b: Balancer, keys: list[str], replicas: list[str], now: float = 0.0) -> dict[str, str]:
    return {k: b.order(k, replicas, now)[0] for k in keys}


def test_four_configurations_on_two_replicas_land_two_and_two() -> None:
    replicas = ["r0", "r1"]
    # keys that plain rendezvous hashing sends to one replica: the bound has work to do
    keys = [k for k in (f"mix{i}" for i in range(64)) if rank(k, replicas)[0] == "r0"][:4]
    assert len(keys) == 4
    b = Balancer()
    where = place(b, keys, replicas)
    assert sorted(Counter(where.values()).values()) == [2, 2]
    for _ in range(3):  # each keeps its replica (its KV stays warm there)
        assert place(b, keys, replicas, now=1.0) == where
    order = b.order(keys[0], replicas, 1.0)
    assert sorted(order) == replicas  # the others follow, for the spill-over


@pytest.mark.parametrize("n_replicas", [1, 2, 3, 4])
def test_no_replica_holds_more_than_its_share(n_replicas: int) -> None:
    """Keys of equal traffic: at most ceil(K / R) keys each, for every K."""
    replicas = [f"r{i}" for i in range(n_replicas)]
    keys = [f"k{i}" for i in range(13)]
    for n in range(1, len(keys) + 1):
        b = Balancer()
        where = place(b, keys[:n], replicas)
        assert max(Counter(where.values()).values()) <= math.ceil(n / n_replicas)
        assert max(b.loads(0.0).values()) <= math.ceil(n / n_replicas) + 1e-9


def test_shares_are_weighted_by_recent_traffic() -> None:
    """A hot configuration counts for its traffic: with 9 of 12 recent requests on ``h``,
    the three quiet ones share the other replica instead of two and two by count."""
    replicas = ["r0", "r1"]
    b = Balancer()
    for _ in range(9):
        b.order("h", replicas, now=0.0)
    where = place(b, ["a", "b", "c"], replicas, now=0.0)
    (hot,) = {b.order("h", replicas, now=0.0)[0]}
    assert set(where.values()) == {next(r for r in replicas if r != hot)}
    counts = Counter(b.order(k, replicas, now=0.0)[0] for k in "habc")  # each keeps its own
    assert counts[hot] == 1 and counts.total() == 4
    # the traffic decays: long after, with h quiet (but active) and a..c busy, a new key
    # goes where the traffic is now lowest: h's replica
    for k in "abc":
        for _ in range(5):
            b.order(k, replicas, now=50.0)
    b.order("h", replicas, now=55.0)
    assert b.order("new", replicas, now=55.0)[0] == hot


def test_quiet_keys_and_departed_replicas_are_placed_again() -> None:
    b = Balancer(window_s=10.0)
    where = place(b, ["a", "b", "c", "d"], ["r0", "r1"])
    assert sorted(Counter(where.values()).values()) == [2, 2]
    assert set(place(b, ["a", "b", "c", "d"], ["r1"], now=1.0).values()) == {"r1"}  # r0 left
    b = Balancer(window_s=10.0)
    place(b, ["a", "b"], ["r0", "r1"])
    later = place(b, ["c", "d"], ["r0", "r1"], now=100.0)  # a and b went quiet: not counted
    assert sorted(Counter(later.values()).values()) == [1, 1]
