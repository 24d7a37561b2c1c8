"""The Ray Serve application of `loraserve ray`: the coordinator actor, the replica
deployment (one loraserve server each, routed by `AffinityRouter`) and the ingress in front,
started on a connected Ray cluster by `start` and removed by `stop`."""

from __future__ import annotations

from dataclasses import dataclass

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from loraserve.cluster.coordinator import Coordinator
from loraserve.cluster.ingress import Ingress
from loraserve.cluster.replica import Replica
from loraserve.cluster.routing import AffinityRouter

APP_NAME = "loraserve"
NAMESPACE = "loraserve"
COORDINATOR = "loraserve-coordinator"
_coordinator: list[object] = []  # the driver holds the coordinator's handle while it serves


@dataclass(frozen=True)
class ClusterConfig:
    """What `loraserve ray` adds to the server's flags."""

    replicas: int = 2
    num_cpus: float = 1.0  # per replica
    max_ongoing: int = 0  # per replica; 0: twice the slots (-np)
    routing: str = "affinity"  # or round_robin
    host: str = "127.0.0.1"
    port: int = 8080


def build(argv: list[str], cc: ClusterConfig, n_slots: int) -> serve.Application:
    """The application: ``argv`` are `loraserve serve` flags, the same for every replica."""
    handle = Coordinator.options(name=COORDINATOR, namespace=NAMESPACE).remote(cc.replicas)
    ray.get(handle.__ray_ready__.remote())
    _coordinator[:] = [handle]
    replica = serve.deployment(
        Replica,
        name="replica",
        num_replicas=cc.replicas,
        ray_actor_options={"num_cpus": cc.num_cpus},
        max_ongoing_requests=cc.max_ongoing or 2 * n_slots,
        request_router_config=RequestRouterConfig(
            request_router_class=AffinityRouter, request_router_kwargs={"mode": cc.routing}
        ),
        health_check_period_s=2,
        health_check_timeout_s=30,
        graceful_shutdown_timeout_s=5,
    )
    ingress = serve.deployment(
        Ingress,
        name="ingress",
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=100_000,
    )
    replicas = replica.bind(argv, COORDINATOR, NAMESPACE)
    return ingress.bind(replicas, COORDINATOR, NAMESPACE, argv)


def start(argv: list[str], cc: ClusterConfig, n_slots: int) -> None:
    """Deploy on the connected cluster (``ray.init`` done) and return once every replica
    is running; the HTTP API is then on ``cc.host:cc.port``."""
    serve.start(http_options={"host": cc.host, "port": cc.port})
    serve.run(build(argv, cc, n_slots), name=APP_NAME, route_prefix="/")


def stop() -> None:
    """Remove the application, Serve and the coordinator from the cluster."""
    serve.shutdown()
    try:
        ray.kill(ray.get_actor(COORDINATOR, namespace=NAMESPACE))
    except ValueError:
        pass
    _coordinator.clear()
