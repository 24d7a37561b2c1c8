"""Command line: llama-server's flags (short and long forms) parsed into a frozen `ServerConfig`.

Defaults are llama-server's (common/common.h and common/arg.cpp of llama.cpp), except where
noted. Flags that only tune llama.cpp internals (GPU offload, flash attention, mmap, ...) are
accepted and ignored so that existing command lines keep working; `--help` lists them.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from typing import Any

from loraserve import __version__
from loraserve.engine.sampling.params import SamplingParams
from loraserve.server import cors
from loraserve.server.llama_flags import add_llama_flags

AUTO_PARALLEL = 4  # llama-server resolves `-np -1` (its default, "auto") to 4 slots
DTYPES = ("auto", "native", "int8", "float32")


@dataclass(frozen=True)
class LoraSpec:
    """An adapter given on the command line; its id is its position in `ServerConfig.lora`."""

    path: str
    scale: float = 1.0


@dataclass(frozen=True)
class ServerConfig:
    """Everything the command line configures. Mirrors llama-server's flags.

    `n_parallel` is already resolved (llama-server's "auto", -1, becomes 4); `n_ctx` 0 means
    the model's trained context; `n_threads` -1 means the engine's choice; `seed` -1 means
    random; `cache_ram_mib` -1 means no limit and 0 disables the cache of unheld prefixes;
    `lora_dirs` are absolute with symlinks resolved; `ignored` lists the ignored flags seen
    (for a startup warning).
    """

    model: str | None = None
    lora: tuple[LoraSpec, ...] = ()
    lora_init_without_apply: bool = False
    lora_dirs: tuple[str, ...] = ()
    n_parallel: int = AUTO_PARALLEL
    n_ctx: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    cache_ram_mib: int = 8192
    cache_prompt: bool = True
    slot_save_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    metrics: bool = False
    n_threads: int = -1
    n_predict: int = -1
    temperature: float = SamplingParams.temperature  # sampling defaults: `SamplingParams`
    top_k: int = SamplingParams.top_k
    top_p: float = SamplingParams.top_p
    min_p: float = SamplingParams.min_p
    repeat_penalty: float = SamplingParams.repeat_penalty
    repeat_last_n: int = SamplingParams.repeat_last_n
    presence_penalty: float = SamplingParams.presence_penalty
    frequency_penalty: float = SamplingParams.frequency_penalty
    seed: int = SamplingParams.seed
    alias: tuple[str, ...] = ()
    dtype: str = "auto"
    webui: bool = True
    cors_origins: str = cors.DEFAULT_ORIGINS  # CORS: see `server/cors.py`
    cors_methods: str = cors.DEFAULT_METHODS
    cors_headers: str = cors.DEFAULT_HEADERS
    cors_credentials: bool = True
    embedding: bool = False  # embeddings and reranking: see `server/embeddings.py`
    reranking: bool = False
    pooling: str | None = None  # None: the model's
    slots: bool = True  # GET /slots (--no-slots: 501)
    sleep_idle_seconds: int = -1  # -1: never sleep
    verbose: bool = False
    ignored: tuple[str, ...] = field(default=(), compare=False)

    def request_defaults(self) -> dict[str, Any]:
        """Server-wide defaults for request fields a request leaves unset (llama-server's
        `params_base`); pass to the request schemas' `with_defaults`."""
        keys = (
            "n_predict temperature top_k top_p min_p repeat_penalty repeat_last_n"
            " presence_penalty frequency_penalty seed cache_prompt"
        ).split()
        return {k: getattr(self, k) for k in keys}

    def to_props_dict(self) -> dict[str, Any]:
        """The part of `GET /props` the command line determines.

        The server adds what the model decides (`chat_template`, `bos_token`, `eos_token`,
        `model_alias` when no `--alias`, the effective `n_ctx` when `-c 0`).
        """
        params = self.request_defaults()
        params.pop("cache_prompt")
        params["max_tokens"] = self.n_predict
        params["stop"] = []
        params["lora"] = []
        props: dict[str, Any] = {
            "default_generation_settings": {"n_ctx": self.n_ctx, "params": params},
            "total_slots": self.n_parallel,
            "model_path": self.model or "",
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": self.slots,
            "endpoint_props": False,
            "endpoint_metrics": self.metrics,
            "build_info": f"loraserve {__version__}",
            "is_sleeping": False,
        }
        if self.alias:
            props["model_alias"] = self.alias[0]
        return props


def _int_in(lo: int, hi: int | None = None, note: str = "") -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be {bounds}{note}, got {value}")
        return value

    return parse


def _float_in(lo: float | None = None, hi: float | None = None) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {value}")
        return value

    return parse


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class _LoraAction(argparse.Action):
    """`--lora A,B` and `--lora-scaled A:0.5,B:1` (or the older `--lora-scaled A 0.5`), in
    command-line order into one list: an adapter's id is its position, as in llama-server."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        specs = list(getattr(namespace, self.dest) or [])
        try:
            if option_string == "--lora":
                specs += [LoraSpec(path) for path in _csv(values)]
            elif len(values) == 2:
                specs.append(LoraSpec(values[0], _float_in()(values[1])))
            elif len(values) == 1:
                for item in _csv(values[0]):
                    path, sep, scale = item.rpartition(":")
                    if not sep or not path:
                        raise argparse.ArgumentTypeError(
                            f"expected PATH:SCALE (or PATH SCALE), got {item!r}"
                        )
                    specs.append(LoraSpec(path, _float_in()(scale)))
            else:
                raise argparse.ArgumentTypeError(
                    f"expected PATH:SCALE[,PATH:SCALE...] or PATH SCALE, got {' '.join(values)!r}"
                )
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, specs)


class _CsvAppend(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *_csv(values)])


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser behind `parse_server_args` (exposed for `--help` rendering)."""
    p = argparse.ArgumentParser(
        prog="loraserve",
        usage="loraserve [serve] [flags]",
        allow_abbrev=False,
        description="llama-server compatible LLM server built for multi-LoRA serving.",
    )
    d = "(default: %(default)s)"
    g = p.add_argument_group("llama-server flags")
    a = g.add_argument
    a("-m", "--model", help="GGUF file or Hugging Face folder (default: the built-in model)")
    a("--lora", action=_LoraAction, metavar="PATH[,PATH]", help="adapter at scale 1")
    a(
        "--lora-scaled",
        dest="lora",
        action=_LoraAction,
        nargs="+",
        metavar="PATH:SCALE",
        help="adapter at a scale: PATH:SCALE[,PATH:SCALE] or PATH SCALE",
    )
    a("--lora-init-without-apply", action="store_true", help="adapters start at scale 0")
    a(
        "-np",
        "--parallel",
        dest="n_parallel",
        type=_int_in(-1, note=" and not 0"),
        help=f"number of slots, -1 = auto = {AUTO_PARALLEL} {d}",
    )
    a("-c", "--ctx-size", dest="n_ctx", type=_int_in(0), help=f"KV tokens, 0 = model's {d}")
    a("-b", "--batch-size", dest="n_batch", type=_int_in(1), help=f"logical batch {d}")
    a("-ub", "--ubatch-size", dest="n_ubatch", type=_int_in(1), help=f"physical batch {d}")
    a(
        "-cram",
        "--cache-ram",
        dest="cache_ram_mib",
        type=_int_in(-1),
        help=f"MiB of cached prefixes no slot holds, -1 = no limit, 0 = off {d}",
    )
    a("--cache-prompt", action=argparse.BooleanOptionalAction, help=f"request default {d}")
    a("--slot-save-path", metavar="DIR", help="directory for POST /slots/{id}?action=save")
    a("--host", help=f"listen address {d}")
    a("--port", type=_int_in(0, 65535), help=f"listen port {d}")
    a("--api-key", dest="api_keys", action=_CsvAppend, metavar="KEY[,KEY]", help="API keys")
    a("--api-key-file", metavar="FILE", help="API keys, one per line, # starts a comment")
    a("--metrics", action="store_true", help="enable GET /metrics")
    a("--webui", "--ui", action=argparse.BooleanOptionalAction, help=f"the web UI at / {d}")
    a("-t", "--threads", dest="n_threads", type=int, help=f"CPU threads, -1 = auto {d}")
    a("-n", "--n-predict", "--predict", dest="n_predict", type=_int_in(-1), help=d)
    a("--temp", "--temperature", dest="temperature", type=_float_in(), help=f"<= 0: greedy {d}")
    a("--top-k", type=_int_in(0), help=d)
    a("--top-p", type=_float_in(0, 1), help=d)
    a("--min-p", type=_float_in(0, 1), help=d)
    a("--repeat-penalty", type=_float_in(0), help=d)
    a("--repeat-last-n", type=_int_in(0), help=d)
    a("--presence-penalty", type=_float_in(), help=d)
    a("--frequency-penalty", type=_float_in(), help=d)
    a("-s", "--seed", type=_int_in(-1, 2**32 - 1), help=f"-1 = random {d}")
    a("-a", "--alias", action=_CsvAppend, metavar="NAME[,NAME]", help="model names for the API")
    a("--slots", action=argparse.BooleanOptionalAction, help=f"GET /slots {d}")
    a("--sleep-idle-seconds", type=_int_in(-1), help=f"sleep when idle, -1 = never {d}")
    a("-v", "--verbose", "--log-verbose", action="store_true", help="debug logs, __verbose")
    cors.add_flags(p)
    from loraserve.server import embeddings  # here: it imports the server, which imports us

    embeddings.add_flags(p)
    o = p.add_argument_group("loraserve flags")
    o.add_argument(
        "--lora-dir",
        dest="lora_dirs",
        action="append",
        metavar="DIR",
        help="directory POST /lora-adapters/load may read from (repeatable)",
    )
    o.add_argument(
        "--dtype",
        choices=DTYPES,
        help="weights: native (the file's own formats, quantized kernels; auto and int8 mean "
        "this) or float32 (every matrix dequantized: the exact reference) " + d,
    )
    add_llama_flags(p)
    defaults = {f.name: f.default for f in fields(ServerConfig)}
    p.set_defaults(**{**defaults, "n_parallel": -1, "lora_dirs": []})
    return p


def _read_api_key_file(parser: argparse.ArgumentParser, path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        parser.error(f"argument --api-key-file: cannot read {path!r}: {exc.strerror}")
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def parse_server_args(argv: list[str]) -> ServerConfig:
    """Parse a llama-server style command line (`argv` without the program name; a leading
    `serve` is skipped). Bad values exit with status 2 and a message naming the flag."""
    parser = build_parser()
    ns = parser.parse_args(argv[1:] if argv[:1] == ["serve"] else argv)
    if ns.n_parallel == 0:
        parser.error("argument -np/--parallel: must be >= 1 (or -1 = auto), got 0")
    api_keys = list(ns.api_keys)
    if ns.api_key_file:
        api_keys += _read_api_key_file(parser, ns.api_key_file)
    if ns.slot_save_path is not None and not os.path.isdir(ns.slot_save_path):
        parser.error(f"argument --slot-save-path: not a directory: {ns.slot_save_path!r}")
    for d in ns.lora_dirs:
        if not os.path.isdir(d):
            parser.error(f"argument --lora-dir: not a directory: {d!r}")
    if not ns.host.strip() or "," in ns.host:
        parser.error(f"argument --host: expected one address, got {ns.host!r}")
    values = {f.name: getattr(ns, f.name) for f in fields(ServerConfig)}
    values.update(
        lora=tuple(ns.lora),
        lora_dirs=tuple(os.path.realpath(d) for d in ns.lora_dirs),
        n_parallel=AUTO_PARALLEL if ns.n_parallel == -1 else ns.n_parallel,
        n_ubatch=min(ns.n_ubatch, ns.n_batch),
        host=ns.host.strip(),
        api_keys=tuple(dict.fromkeys(api_keys)),
        n_threads=ns.n_threads if ns.n_threads > 0 else -1,
        temperature=max(ns.temperature, 0.0),
        seed=-1 if ns.seed == 2**32 - 1 else ns.seed,
        alias=tuple(dict.fromkeys(ns.alias)),
        embedding=ns.embedding or ns.reranking,
        ignored=tuple(ns.ignored),
    )
    return ServerConfig(**values)
