"""Command line: llama-server's flags (short and long forms) parsed into a frozen `ServerConfig`.

Defaults are llama-server's (common/common.h and common/arg.cpp of llama.cpp), except where
noted. Flags that only tune llama.cpp internals (GPU offload, flash attention, mmap, ...) are
accepted and ignored so that existing command lines keep working; `--help` lists them.
"""

from __future__ import annotations

import argparse
import functools
import os
from dataclasses import MISSING, fields

from loraserve import __version__
from loraserve.server.config import (
    admission_flags,
    chat_flags,
    lora_flags,
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
    read_api_key_file,
)
from loraserve.server.config.llama_flags import add_llama_flags
from loraserve.server.config.server_config import AUTO_PARALLEL, DTYPES, ServerConfig

__all__ = [
    "AUTO_PARALLEL",
    "DTYPES",
    "LoraSpec",
    "ServerConfig",
    "build_parser",
    "parse_server_args",
]


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
    a(
        "-hf",
        "-hfr",
        "--hf-repo",
        metavar="REPO[:TAG]",
        dest="hf_repo",
        help="a model (or a repository of presets) on the Hugging Face hub, downloaded into "
        "its cache (LLAMA_CACHE, ...) unless --offline; MODEL_ENDPOINT / HF_ENDPOINT name the hub",
    )
    a("-hff", "--hf-file", metavar="FILE", dest="hf_file", help="that file of the -hf repository")
    a("--offline", action="store_true", help="-hf: the cache's copy only, never the hub")
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
    a(
        "-cms",
        "--checkpoint-min-step",
        dest="checkpoint_min_step",
        type=int_in(0),
        help=f"recurrent models: tokens between state snapshots (and each prompt's end), "
        f"0 = every KV block; a full slot drops older checkpoints this close together {d}",
    )
    a(
        "-ctxcp",
        "--ctx-checkpoints",
        "--swa-checkpoints",
        dest="ctx_checkpoints",
        type=int_in(0),
        help=f"recurrent models: the most state checkpoints a slot keeps (where its prompts "
        f"began, 4 tokens before their ends), 0 = none {d}",
    )
    a("--cache-prompt", action=argparse.BooleanOptionalAction, help=f"request default {d}")
    a("--slot-save-path", metavar="DIR", help="directory for POST /slots/{id}?action=save")
    a(
        "--slot-save-max",
        dest="slot_save_max_mib",
        type=int_in(-1),
        metavar="MIB",
        help=f"MiB all slot files in --slot-save-path may take, -1 = no limit {d}",
    )
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
    lora_flags.add_flags(o)
    o.add_argument(
        "--dtype",
        choices=DTYPES,
        help="weights: native (the file's own formats, quantized kernels; auto and int8 mean "
        "this) or float32 (every matrix dequantized: the exact reference) " + d,
    )
    o.add_argument(
        "--scan-form",
        choices=("recurrent", "chunked"),
        help="gated delta-net and Mamba-2 layers: token by token, or prompts in chunks of 16 "
        "positions (delta-net decode then runs its recurrence; the same bits alone, batched "
        "and cached either way) " + d,
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


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """One parser for every parse: building it is ~8 ms, and the router parses once per
    preset. Sharing it is safe: parsing writes only to its own namespace (every action that
    adds to a list or tuple default makes a new one)."""
    return build_parser()


def parse_server_args(argv: list[str]) -> ServerConfig:
    """Parse a llama-server style command line (`argv` without the program name; a leading
    `serve` is skipped). Bad values exit with status 2 and a message naming the flag."""
    parser = _parser()
    ns = parser.parse_args(argv[1:] if argv[:1] == ["serve"] else argv)
    if ns.n_parallel == 0:
        parser.error("argument -np/--parallel: must be >= 1 (or -1 = auto), got 0")
    if ns.hf_repo is not None:  # downloaded into the cache first, as llama-server does
        from loraserve.server.router.download import resolve_arg

        if ns.model is not None:
            parser.error("argument -hf/--hf-repo: give it or -m, not both")
        offline = ns.offline or os.environ.get("LLAMA_OFFLINE", "") not in ("", "0")
        try:
            kind, path = resolve_arg(ns.hf_repo, ns.hf_file or "", offline)
        except ValueError as e:
            parser.error(f"argument -hf/--hf-repo: {e}")
        if kind == "preset":  # a preset repository: the router on its preset.ini
            ns.models_preset = path
        else:
            ns.model = path
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
