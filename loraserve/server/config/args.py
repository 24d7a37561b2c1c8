"""Command line: llama-server's flags (short and long forms) parsed into a frozen `ServerConfig`.

Defaults are llama-server's (common/common.h and common/arg.cpp of llama.cpp), except where
noted. Flags that only tune llama.cpp internals (GPU offload, flash attention, mmap, ...) are
accepted and ignored so that existing command lines keep working; `--help` lists them.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from loraserve import __version__
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecConfig
from loraserve.server import cors
from loraserve.server.config import (
    admission_flags,
    chat_flags,
    router_flags,
    spec_flags,
    tools_flags,
)
from loraserve.server.config.api_flags import add_cors_flags, add_embedding_flags
from loraserve.server.config.arg_types import (
    ApiKeyAppend,
    CsvAppend,
    LoraAction,
    LoraSpec,
    chat_template_file,
    chat_template_flag,
    float_in,
    int_in,
    json_object,
    lora_module,
    read_api_key_file,
)
from loraserve.server.config.llama_flags import add_llama_flags

AUTO_PARALLEL = 4  # llama-server resolves `-np -1` (its default, "auto") to 4 slots
DTYPES = ("auto", "native", "int8", "float32")


@dataclass(frozen=True)
class ServerConfig:
    """Everything the command line configures. Mirrors llama-server's flags.

    `n_parallel` is already resolved (llama-server's "auto", -1, becomes 4); `n_ctx` 0 means
    the model's trained context; `n_threads` -1 means the engine's choice; `seed` -1 means
    random; `cache_ram_mib` -1 means no limit and 0 disables the cache of unheld prefixes;
    `lora_dirs` are absolute with symlinks resolved; `chat_template` is `--chat-template`'s
    value or `--chat-template-file`'s text (`chat_template_origin` names the flag, checked
    at parse time); `ignored` lists the ignored flags seen (for a startup warning).
    """

    model: str | None = None
    lora: tuple[LoraSpec, ...] = ()
    lora_init_without_apply: bool = False
    lora_dirs: tuple[str, ...] = ()
    lora_modules: tuple[tuple[str, str, str | None], ...] = ()  # vLLM's (name, path, base)
    lora_max_loaded: int | None = None
    lora_max_memory: float | None = None  # MiB of resident adapter weights
    max_queue: int = admission_flags.DEFAULT_MAX_QUEUE  # see `server/config/admission_flags.py`
    max_connections: int = admission_flags.DEFAULT_MAX_CONNECTIONS
    cache_isolation: str = "none"
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
    tags: tuple[str, ...] = ()  # `--tags`: shown in /v1/models, nothing else
    dtype: str = "auto"
    webui: bool = True
    cors_origins: str = cors.DEFAULT_ORIGINS  # CORS: see `server/cors.py`
    cors_methods: str = cors.DEFAULT_METHODS
    cors_headers: str = cors.DEFAULT_HEADERS
    cors_credentials: bool = True
    embedding: bool = False  # embeddings and reranking: see `server/native/embeddings.py`
    reranking: bool = False
    pooling: str | None = None  # None: the model's
    slots: bool = True  # GET /slots (--no-slots: 501)
    kv_unified: bool = False  # -kvu: every slot may use the whole context
    # -ctk/-ctv: the KV pool's type; f16 also runs llama.cpp's f16 attention numerics
    # (kernels/attention_f16.h). llama-server's default is f16; loraserve's stays f32.
    cache_type_k: str = "f32"
    cache_type_v: str = "f32"
    sleep_idle_seconds: int = -1  # -1: never sleep
    verbose: bool = False
    chat_template: str | None = None
    chat_template_origin: str = ""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, compare=False)
    strict_model_names: bool = False
    reasoning_format: str = "auto"  # chat parsing: see `server/config/chat_flags.py`
    reasoning_budget: int = -1
    skip_chat_parsing: bool = False
    reasoning: str = "auto"  # chat rendering: see `server/config/chat_flags.py`
    prefill_assistant: bool = True
    spec: SpecConfig = SpecConfig()  # speculative decoding: see `server/config/spec_flags.py`
    router: bool = False  # router mode (no -m, a router flag): see `server/config/router_flags.py`
    models_dir: str | None = None
    models_preset: str | None = None
    models_max: int = router_flags.DEFAULT_MODELS_MAX
    models_autoload: bool = True
    tools: tools_flags.ToolsConfig = field(default=tools_flags.ToolsConfig(), compare=False)
    argv: tuple[str, ...] = field(default=(), compare=False)  # as given (router: the children's)
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
        params["speculative.types"] = ",".join(self.spec.types) or "none"
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
            "cors_proxy_enabled": self.tools.ui_mcp_proxy,  # the web UI's MCP proxy
        }
        if self.alias:
            props["model_alias"] = self.alias[0]
        return props


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser behind `parse_server_args` (exposed for `--help` rendering)."""
    p = argparse.ArgumentParser(
        prog="loraserve",
        usage="loraserve [serve] [flags] | loraserve {generate,merge,ray,build-kernels} ...",
        allow_abbrev=False,
        description="llama-server compatible LLM server built for multi-LoRA serving.\n\n"
        "commands:\n"
        "  serve          run the HTTP server (the default: `loraserve [flags]` is "
        "`loraserve serve`)\n"
        "  generate       one completion from the shell (`loraserve generate --help`)\n"
        "  merge          combine LoRA adapters into one (`loraserve merge --help`)\n"
        "  ray            replicas on Ray Serve (`loraserve ray --help`)\n"
        "  build-kernels  compile the C kernels now (`loraserve build-kernels --help`)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"loraserve {__version__}")
    d = "(default: %(default)s)"
    g = p.add_argument_group("llama-server flags")
    a = g.add_argument
    a("-m", "--model", help="GGUF file or Hugging Face folder (default: the built-in model)")
    a("--lora", action=LoraAction, metavar="PATH[,PATH]", help="adapter at scale 1")
    a(
        "--lora-scaled",
        dest="lora",
        action=LoraAction,
        nargs="+",
        metavar="PATH:SCALE",
        help="adapter at a scale: PATH:SCALE[,PATH:SCALE] or PATH SCALE",
    )
    a("--lora-init-without-apply", action="store_true", help="adapters start at scale 0")
    a(
        "-np",
        "--parallel",
        dest="n_parallel",
        type=int_in(-1, note=" and not 0"),
        help=f"number of slots, -1 = auto = {AUTO_PARALLEL} {d}",
    )
    a("-c", "--ctx-size", dest="n_ctx", type=int_in(0), help=f"KV tokens, 0 = model's {d}")
    a("-b", "--batch-size", dest="n_batch", type=int_in(1), help=f"logical batch {d}")
    a("-ub", "--ubatch-size", dest="n_ubatch", type=int_in(1), help=f"physical batch {d}")
    a(
        "-cram",
        "--cache-ram",
        dest="cache_ram_mib",
        type=int_in(-1),
        help=f"MiB of cached prefixes no slot holds, -1 = no limit, 0 = off {d}",
    )
    a("--cache-prompt", action=argparse.BooleanOptionalAction, help=f"request default {d}")
    a("--slot-save-path", metavar="DIR", help="directory for POST /slots/{id}?action=save")
    a("--host", help=f"listen addresses, comma-separated {d}")
    a("--port", type=int_in(0, 65535), help=f"listen port {d}")
    a("--api-key", dest="api_keys", action=ApiKeyAppend, metavar="KEY[,KEY]", help="API keys")
    a("--api-key-file", metavar="FILE", help="API keys, one per line, # starts a comment")
    a("--metrics", action="store_true", help="enable GET /metrics")
    a("--webui", "--ui", action=argparse.BooleanOptionalAction, help=f"the web UI at / {d}")
    a("-t", "--threads", dest="n_threads", type=int, help=f"CPU threads, -1 = auto {d}")
    a("-n", "--n-predict", "--predict", dest="n_predict", type=int_in(-1), help=d)
    a("--temp", "--temperature", dest="temperature", type=float_in(), help=f"<= 0: greedy {d}")
    a("--top-k", type=int_in(0), help=d)
    a("--top-p", type=float_in(0, 1), help=d)
    a("--min-p", type=float_in(0, 1), help=d)
    a("--repeat-penalty", type=float_in(0), help=d)
    a("--repeat-last-n", type=int_in(0), help=d)
    a("--presence-penalty", type=float_in(), help=d)
    a("--frequency-penalty", type=float_in(), help=d)
    a("-s", "--seed", type=int_in(-1, 2**32 - 1), help=f"-1 = random {d}")
    a("-a", "--alias", action=CsvAppend, metavar="NAME[,NAME]", help="model names for the API")
    a("--tags", action=CsvAppend, metavar="TAG[,TAG]", help="model tags in /v1/models")
    a("--slots", action=argparse.BooleanOptionalAction, help=f"GET /slots {d}")
    a("-kvu", "--kv-unified", action="store_true", help="every slot may use all of -c")
    a("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false",
      help="-c / -np tokens per slot (default)")  # fmt: skip
    for short, long in (("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v")):
        a(short, long, choices=("f32", "f16"),
          help="KV cache type (f16: llama-server's numerics and half the memory; -ctk and -ctv "
               f"alike) {d}")  # fmt: skip
    a("--sleep-idle-seconds", type=int_in(-1), help=f"sleep when idle, -1 = never {d}")
    a("-v", "--verbose", "--log-verbose", action="store_true", help="debug logs, __verbose")
    add_cors_flags(p)
    add_embedding_flags(p)
    spec_flags.add_flags(p)
    admission_flags.add_flags(p)
    a(
        "--chat-template",
        type=chat_template_flag,
        metavar="NAME|JINJA",
        help="llama.cpp built-in template (chatml, gemma, llama2, llama3, mistral-v7, phi3, "
        "qwen, deepseek, ...) or Jinja text (default: the model's)",
    )
    a("--chat-template-file", type=chat_template_file, metavar="FILE", help="Jinja template")
    a(
        "--chat-template-kwargs",
        type=json_object,
        metavar="JSON",
        help="extra template variables for every request, e.g. '{\"enable_thinking\": false}'",
    )
    a("--jinja", action="store_true", help="templates run as Jinja (always; as llama-server)")
    o = p.add_argument_group("loraserve flags")
    o.add_argument(
        "--lora-dir",
        dest="lora_dirs",
        action="append",
        metavar="DIR",
        help="adapter catalogue: every GGUF LoRA file and PEFT folder in DIR is served by name "
        "(request `model` or a `lora` entry's `name`), read on first use; the load endpoints "
        "read only from these directories (repeatable)",
    )
    o.add_argument(
        "--lora-modules",
        dest="lora_modules",
        action="extend",
        nargs="+",
        type=lora_module,
        metavar="NAME=PATH|JSON",
        help="vLLM's named adapters: name=path or "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\', read on first use',
    )
    o.add_argument(
        "--lora-max-loaded",
        type=int_in(1),
        metavar="N",
        help="at most N adapters resident in memory; idle ones are evicted least recently "
        "used, never pinned ones or those in use (default: no limit)",
    )
    o.add_argument(
        "--lora-max-memory",
        type=float_in(0.0),
        metavar="MiB",
        help="budget for resident adapter weights, evicted as --lora-max-loaded (default: none)",
    )
    o.add_argument(
        "--dtype",
        choices=DTYPES,
        help="weights: native (the file's own formats, quantized kernels; auto and int8 mean "
        "this) or float32 (every matrix dequantized: the exact reference) " + d,
    )
    o.add_argument(
        "--strict-model-names",
        action="store_true",
        help="a request `model` naming neither the model nor a loaded adapter is a 404 "
        "(default: served by the base model, as llama-server does, with a warning)",
    )
    chat_flags.add_flags(p)
    router_flags.add_flags(p)
    tools_flags.add_flags(p)
    add_llama_flags(p)
    defaults = {f.name: f.default for f in fields(ServerConfig) if f.default is not MISSING}
    unset = {"n_parallel": -1, "lora_dirs": [], "lora_modules": [], "chat_template_kwargs": None}
    p.set_defaults(**{**defaults, **unset})
    return p


def parse_server_args(argv: list[str]) -> ServerConfig:
    """Parse a llama-server style command line (`argv` without the program name; a leading
    `serve` is skipped). Bad values exit with status 2 and a message naming the flag."""
    parser = build_parser()
    ns = parser.parse_args(argv[1:] if argv[:1] == ["serve"] else argv)
    if ns.n_parallel == 0:
        parser.error("argument -np/--parallel: must be >= 1 (or -1 = auto), got 0")
    api_keys = list(ns.api_keys)
    if ns.api_key_file:
        api_keys += read_api_key_file(parser, ns.api_key_file)
    if ns.slot_save_path is not None and not os.path.isdir(ns.slot_save_path):
        parser.error(f"argument --slot-save-path: not a directory: {ns.slot_save_path!r}")
    for d in ns.lora_dirs:
        if not os.path.isdir(d):
            parser.error(f"argument --lora-dir: not a directory: {d!r}")
    names = [m[0].casefold() for m in ns.lora_modules]
    if len(set(names)) != len(names):
        parser.error("argument --lora-modules: a name is given twice")
    if ns.chat_template is not None and ns.chat_template_file is not None:
        parser.error("argument --chat-template-file: give it or --chat-template, not both")
    if ns.cache_type_k != ns.cache_type_v:
        parser.error(
            f"argument -ctv/--cache-type-v: {ns.cache_type_v} with -ctk/--cache-type-k "
            f"{ns.cache_type_k}: loraserve keeps K and V in one type, give both the same"
        )
    hosts = [h.strip() for h in ns.host.split(",")]
    if not all(hosts):
        parser.error(f"argument --host: expected addresses separated by commas, got {ns.host!r}")
    values = {f.name: getattr(ns, f.name, None) for f in fields(ServerConfig)}
    values.update(
        chat_template=ns.chat_template if ns.chat_template is not None else ns.chat_template_file,
        chat_template_origin=(
            "--chat-template"
            if ns.chat_template is not None
            else "--chat-template-file"
            if ns.chat_template_file is not None
            else ""
        ),
        chat_template_kwargs=chat_flags.template_kwargs(ns),
        lora=tuple(ns.lora),
        lora_dirs=tuple(os.path.realpath(d) for d in ns.lora_dirs),
        lora_modules=tuple(ns.lora_modules),
        n_parallel=AUTO_PARALLEL if ns.n_parallel == -1 else ns.n_parallel,
        n_ubatch=min(ns.n_ubatch, ns.n_batch),
        host=",".join(dict.fromkeys(hosts)),
        api_keys=tuple(dict.fromkeys(api_keys)),
        n_threads=ns.n_threads if ns.n_threads > 0 else -1,
        temperature=max(ns.temperature, 0.0),
        seed=-1 if ns.seed == 2**32 - 1 else ns.seed,
        alias=tuple(sorted(set(ns.alias))),  # llama-server's std::set: the first is the name
        tags=tuple(sorted(set(ns.tags))),
        embedding=ns.embedding or ns.reranking,
        ignored=tuple(ns.ignored),
        spec=spec_flags.config(ns, parser),
        argv=tuple(argv[1:] if argv[:1] == ["serve"] else argv),
    )
    values.update(router_flags.config(ns, parser))
    values.update(admission_flags.config(ns))
    values.update(tools_flags.config(ns, parser, values))
    return ServerConfig(**values)
