"""Helpers for the HTTP and engine tests: a tiny model written once per session, the one
PEFT writer (`write_peft`; `peft_folder` for the tiny model), and a real server on 127.0.0.1
(random free port): uvicorn in a thread of the test process (`serve_in_thread`), or a
`loraserve` process (`start_process`); its metrics (`scrape_metrics`) and client threads
(`concurrently`)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
import uvicorn
from fastapi import FastAPI
from safetensors.torch import save_file

from loraserve.model.loader import LoadedModel, load_model
from loraserve.server.app import HTTP_IMPL, create_app
from loraserve.server.config.args import parse_server_args


@functools.cache
def tiny_model_path() -> Path:
    """A tiny random llama (vocab 320, 2 layers, context 256) as a GGUF file."""
    from tests.tiny import hf_model, write_gguf

    folder = Path(tempfile.mkdtemp(prefix="loraserve-srv-"))
    return write_gguf(folder / "tiny.gguf", hf_model("llama", seed=7), "llama")


@functools.cache
def tiny_model() -> LoadedModel:
    """The tiny model, loaded once and shared by every test server (read-only weights)."""
    return load_model(tiny_model_path())


HIDDEN, Q_OUT, KV_OUT = 64, 64, 32  # tiny llama: 4 heads x 16, 2 kv heads


def write_peft(
    path: Path, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], r: int, alpha: float
) -> Path:
    """A PEFT LoRA folder (the one writer the tests use) from HF module name
    (``model.layers.0.self_attn.q_proj``) -> (A [r, in], B [out, r]); the target modules
    are the modules' last names."""
    targets = sorted({m.rpartition(".")[2] for m in pairs})
    tensors = {}
    for module, (a, b) in pairs.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.contiguous()
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    conf = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": targets}
    (path / "adapter_config.json").write_text(json.dumps(conf))
    return path


def peft_folder(path: Path, seed: int, magnitude: float = 0.5, r: int = 4) -> Path:
    """A PEFT LoRA folder on q_proj and v_proj of the tiny llama, strong enough to matter;
    ``magnitude`` scales A and B."""
    g = torch.Generator().manual_seed(seed)
    pairs = {}
    for i in range(2):
        for mod, out in (("q_proj", Q_OUT), ("v_proj", KV_OUT)):
            a = torch.randn(r, HIDDEN, generator=g) * magnitude
            b = torch.randn(out, r, generator=g) * magnitude
            pairs[f"model.layers.{i}.self_attn.{mod}"] = (a, b)
    return write_peft(path, pairs, r, alpha=8)


@dataclass
class Served:
    """A running test server: its base URL, app, and an httpx client bound to it."""

    url: str
    app: FastAPI
    client: httpx.Client

    def sse(self, path: str, body: dict[str, Any], **kw: Any) -> list[str]:
        """POST a streaming request; the `data:` payloads in order (raw strings)."""
        with self.client.stream("POST", path, json=body, **kw) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            text = r.read().decode()
        events = text.split("\n\n")
        assert events[-1] == "", f"stream must end with a blank line: {text[-50:]!r}"
        assert all(e.startswith("data: ") for e in events[:-1]), text
        return [e.removeprefix("data: ") for e in events[:-1]]

    def sse_json(self, path: str, body: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.sse(path, body, **kw) if e != "[DONE]"]


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def serve_in_thread(
    args: list[str],
    model: LoadedModel | None = None,
    loader: Callable[[], LoadedModel] | None = None,
    wait_ready: bool = True,
) -> Iterator[Served]:
    """Run `create_app` under uvicorn with llama-server flags `args` (`-m` is the tiny
    model unless given); stops it on exit, with torch's thread count as it found it (a
    process-wide setting: left at 1, every later test ran single-threaded, which hid a
    2-thread batch dependence of the sampler's full-vocabulary sums)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if "-m" not in args:
        args = ["-m", str(tiny_model_path()), *args]
    cfg = parse_server_args(args)
    if model is None and loader is None:
        model = tiny_model()
    app = create_app(cfg, model, loader=loader)
    sock = free_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app, http=HTTP_IMPL, log_level="warning", timeout_graceful_shutdown=2, lifespan="on"
        )  # fmt: skip
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=60)
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
            time.sleep(0.01)
        while wait_ready and client.get("/health").status_code != 200:
            if app.state.server.load_error:
                raise RuntimeError(f"cannot start: {app.state.server.load_error}")
            assert time.monotonic() < deadline, "model did not load"
            time.sleep(0.02)
        yield Served(url, app, client)
    finally:
        client.close()
        server.should_exit = True
        thread.join(15)
        sock.close()
        torch.set_num_threads(threads)


def on_loop() -> bool:
    """Whether the caller runs on an asyncio event loop (a served app's, in its thread)."""
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def scrape_metrics(srv: Served) -> dict[str, float]:
    """`GET /metrics` as metric name -> value (a labelled family's values summed)."""
    out: dict[str, float] = {}
    for line in srv.client.get("/metrics").text.splitlines():
        m = re.fullmatch(r"([a-z_:]+)(\{[^}]*\})? (\S+)", line)
        if m:
            out[m[1]] = out.get(m[1], 0.0) + float(m[3])
    return out


LAUNCH_WITH_GRACE = (
    "import sys, loraserve.server.process as p; p.SHUTDOWN_GRACE_S = {grace}; "
    "from loraserve.cli import main; main(sys.argv[1:])"
)


def start_process(args: list[str], grace_s: float | None = None) -> tuple[subprocess.Popen, str]:
    """A `loraserve` server process on the tiny model (one thread), once healthy: the
    process and its base URL. With ``grace_s``, its shutdown grace period is that."""
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    grace = [] if grace_s is None else ["-c", LAUNCH_WITH_GRACE.format(grace=grace_s)]
    launch = grace or ["-m", "loraserve.cli"]
    cmd = [sys.executable, *launch, "-m", str(tiny_model_path()), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [*cmd, "-t", "1", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "server process did not become healthy"
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def concurrently(fn: Callable[[Any], object], args: Iterable[Any], timeout: float = 60) -> None:
    """``fn(arg)`` for every arg, each in its own thread, all at once; the first failure is
    raised again in the caller's thread."""
    errors: list[BaseException] = []

    def run(arg: Any) -> None:
        try:
            fn(arg)
        except BaseException as e:  # re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
