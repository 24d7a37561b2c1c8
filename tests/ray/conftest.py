"""A local Ray cluster (2 CPUs) serving `loraserve ray`'s application: 2 replicas of the
tiny model with two PEFT adapters, once per module; Ray is shut down after it. Every test
here skips, saying why, when Ray Serve is not installed."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_util import free_socket, peft_folder, tiny_model_path

NO_RAY = "Ray Serve is not installed: pip install -e '.[ray]'"


@dataclass
class RayApp:
    """The running application: its client, the serve flags of every replica, the folder
    run-time adapters load from."""

    client: httpx.Client
    argv: list[str]
    lora_dir: Path

    def coordinator(self) -> Any:
        """The coordinator actor (to ask every replica directly)."""
        import ray

        from loraserve.cluster.app import COORDINATOR, NAMESPACE

        return ray.get_actor(COORDINATOR, namespace=NAMESPACE)

    def wait_healthy(self, timeout: float = 60) -> None:
        """Until `/health` is ok (every replica up)."""
        deadline = time.monotonic() + timeout
        while (r := self.client.get("/health")).status_code != 200:
            assert time.monotonic() < deadline, f"not healthy: {r.text}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def adapters() -> tuple[Path, list[Path]]:
    """A --lora-dir with two PEFT adapters of the tiny model (a third for run-time loads)."""
    folder = Path(tempfile.mkdtemp(prefix="loraserve-ray-"))
    return folder, [peft_folder(folder / f"a{i}", seed=30 + i) for i in range(3)]


def serve_argv(adapters: tuple[Path, list[Path]]) -> list[str]:
    """The serve flags the Ray replicas and the single reference server share."""
    folder, paths = adapters
    return [
        "-m", str(tiny_model_path()), "-t", "1", "-np", "4", "-c", "1024", "--metrics",
        "--lora", str(paths[0]), "--lora-scaled", f"{paths[1]}:0", "--lora-dir", str(folder),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def ray_app(adapters: tuple[Path, list[Path]]) -> Iterator[RayApp]:
    """Two replicas of the tiny model on a local Ray cluster; everything stopped after."""
    pytest.importorskip("ray.serve", reason=NO_RAY)
    import ray

    from loraserve.cluster.app import NAMESPACE, ClusterConfig, start, stop

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    argv = serve_argv(adapters)
    try:
        start(argv, ClusterConfig(replicas=2, num_cpus=1, max_ongoing=4, port=port), 4)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        app = RayApp(client, argv, adapters[0])
        app.wait_healthy()
        yield app
        client.close()
    finally:
        stop()
        ray.shutdown()
