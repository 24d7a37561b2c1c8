"""`ServerConfig`: everything the command line configures, frozen (parsed by `args`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loraserve import __version__
from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecConfig
from loraserve.server import cors
from loraserve.server.config import admission_flags, router_flags, tools_flags
from loraserve.server.config.arg_types import LoraSpec

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
    preempt_after_s: float = admission_flags.DEFAULT_PREEMPT_AFTER_S
    cache_isolation: str = "none"
    n_parallel: int = AUTO_PARALLEL
    n_ctx: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    cache_ram_mib: int = 8192
    checkpoint_min_step: int = 8192  # -cms: recurrent state snapshots this many tokens apart
    ctx_checkpoints: int = 32  # -ctxcp: recurrent state checkpoints a slot keeps at most
    cache_prompt: bool = True
    slot_save_path: str | None = None
    slot_save_max_mib: int = 4096  # all slot files in slot_save_path; -1 = no limit
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
    scan_form: str = "recurrent"  # --scan-form: delta-net and Mamba-2 scans by token or chunked
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
    reasoning_budget_message: str = ""
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
