"""`loraserve ray [serve flags] --replicas N [--ray-address ADDR] [--num-cpus-per-replica C]`:
start (or join) a Ray cluster and serve the loraserve HTTP API on `--host/--port` from N
replicas, each one loraserve server started with the same serve flags."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from loraserve.cluster import INSTALL_HINT

log = logging.getLogger("loraserve.cluster")


def parser() -> argparse.ArgumentParser:
    """The flags `loraserve ray` adds; every other flag is a `loraserve serve` flag."""
    ap = argparse.ArgumentParser(
        prog="loraserve ray",
        description=__doc__,
        epilog="Every other flag is passed to each replica as `loraserve serve` takes it.",
    )
    ap.add_argument("--replicas", type=int, default=2, help="loraserve replicas (default 2)")
    ap.add_argument(
        "--ray-address",
        default=os.environ.get("RAY_ADDRESS"),
        help="join this Ray cluster (default $RAY_ADDRESS; none: start a local one)",
    )
    ap.add_argument(
        "--num-cpus-per-replica", type=float, default=1.0, help="Ray CPUs per replica (1)"
    )
    ap.add_argument(
        "--max-ongoing-requests",
        type=int,
        default=0,
        help="requests a replica takes before the next spill over (default 2 x -np)",
    )
    ap.add_argument(
        "--routing",
        choices=("affinity", "round_robin"),
        default="affinity",
        help="affinity: by the request's adapter cache key (default); round_robin: in turn",
    )
    return ap


def main(argv: list[str]) -> None:
    """Run `loraserve ray` until SIGINT/SIGTERM, then remove the application."""
    ap = parser()
    if {"-h", "--help"} & set(argv):
        ap.print_help()
        return
    ours, serve_argv = ap.parse_known_args(argv)
    if ours.replicas < 1 or ours.num_cpus_per_replica <= 0:
        ap.error("--replicas and --num-cpus-per-replica must be positive")
    try:
        import ray

        from loraserve.cluster.app import ClusterConfig, start, stop
    except ImportError:
        sys.exit(f"error: {INSTALL_HINT}")
    from loraserve.server.config.args import parse_server_args
    from loraserve.server.startup import StartupError, check_files

    cfg = parse_server_args(serve_argv)
    if "," in cfg.host:
        ap.error("--host: Ray Serve listens on one address (0.0.0.0 for all of them)")
    try:
        check_files(cfg)
    except StartupError as e:
        log.error("cannot start: %s", e)
        sys.exit(1)
    if cfg.n_threads <= 0:  # each replica computes on its own CPUs
        serve_argv = [*serve_argv, "-t", str(max(1, int(ours.num_cpus_per_replica)))]
    cc = ClusterConfig(
        replicas=ours.replicas,
        num_cpus=ours.num_cpus_per_replica,
        max_ongoing=ours.max_ongoing_requests,
        routing=ours.routing,
        host=cfg.host,
        port=cfg.port,
    )
    ray.init(address=ours.ray_address, namespace="loraserve", log_to_driver=True)
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        start(serve_argv, cc, cfg.n_parallel)
        log.info(
            "loraserve ray: %d replicas listening on http://%s:%d", cc.replicas, cc.host, cc.port
        )
        stopped.wait()
        log.info("shutting down")
    finally:
        stop()
        ray.shutdown()
