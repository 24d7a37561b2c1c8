"""The router's catalogue: models of the download cache (`hf_cache`, llama-server's
`ORG/NAME:TAG` ids), models found under `--models-dir` and presets read from
`--models-preset FILE.ini`, as llama-server reads them (common/preset.cpp), and how they map
onto engines.

INI: `key = value` lines under `[section]` headers, `;` and `#` comments; a section per preset
(its name is the model id clients send), `[*]` holds settings every preset inherits, keys are
flags without dashes (long or short form, or a `LLAMA_ARG_*` environment name), `true` /
`false` for switches. `load-on-startup`, `stop-timeout` and `dedup-cache-models` belong to the
router. A section named like a `--models-dir` model (or the default model, listed as
llama-server lists its download cache when its package is installed) configures that model.
Precedence, as llama-server: the router's command line, then the preset's section, then `[*]`.

**Ours: presets share engines.** Each preset's flags are parsed into a `ServerConfig`; its
adapters (`lora`, `lora-scaled`), its sampling defaults (`temp`, `top-k`, `n-predict`, ...)
and its `chat-template-kwargs` are taken out as the preset's per-request settings, and what is
left (model file, context, slots, chat template, ...) is the engine's key: presets with equal
keys run on one engine that holds the union of their adapters at scale 0, and each request
under a preset gets that preset's adapter mix and defaults (`Preset.inject`), so its cache key
is its own mix's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loraserve.server.config.arg_types import LoraSpec
from loraserve.server.config.args import ServerConfig, build_parser, parse_server_args
from loraserve.server.router.hf_cache import cached_models, dedup_hidden, pending_hf
from loraserve.server.router.model_files import default_model_entry, models_dir_entries

ROUTER_KEYS = ("load-on-startup", "stop-timeout", "dedup-cache-models")
DEFAULT_STOP_TIMEOUT_S = 10.0  # llama-server's
# The router's own flags, never passed to an engine (llama-server resets them in children).
_ROUTER_VALUE_FLAGS = {
    "-m", "--model", "--host", "--port", "--api-key", "--api-key-file", "-a", "--alias",
    "--models-dir", "--models-preset", "--models-max",
    "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file",  # the router's own (a preset repository)
}  # fmt: skip
_ROUTER_SWITCHES = {"--models-autoload", "--no-models-autoload"}
_REQUEST_KEYS = tuple(ServerConfig().request_defaults())  # sampling defaults, per request
_TRUE = {"", "1", "true", "on", "yes"}


class PresetError(ValueError):
    """A preset that cannot be served (no model, an unknown key, a bad value)."""


@dataclass(frozen=True)
class Preset:
    """One model id the router serves: its engine's configuration (`engine_cfg`, shared by
    the presets with the same key) and what each of its requests gets (`lora`, `defaults`).
    `error` is set, and the rest empty, when its flags cannot be served."""

    name: str
    source: str  # llama-server's "models_dir" or "preset"
    ini: str = ""  # its section as INI text (GET /models status.preset)
    args: tuple[str, ...] = ()  # its flags, as an engine's command line (status.args)
    engine_cfg: ServerConfig | None = None
    lora: tuple[LoraSpec, ...] = ()  # its mix over the engine's adapters
    defaults: dict[str, Any] = field(default_factory=dict, compare=False)
    load_on_startup: bool = False
    stop_timeout: float = DEFAULT_STOP_TIMEOUT_S
    error: str | None = None
    listed: bool = True  # in GET /models (a cache entry `dedup-cache-models` hides: False)
    removable: bool = False  # a model of the download cache (`DELETE /models` deletes it)
    hf: tuple[str, str] | None = None  # (REPO[:TAG], FILE) not cached yet: `router.pending`

    @property
    def key(self) -> ServerConfig | None:
        """The engine this preset runs on (presets with equal keys share it)."""
        return self.engine_cfg

    def inject(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with this preset's adapter mix (as `lora` ids of its engine, unless the
        request gives its own `lora`), sampling defaults (unless the request sets them) and
        chat template kwargs (under the request's own). Adapters at scale 0 are loaded, not
        sent: they keep the engine's global scale (0 until `POST /lora-adapters` sets one),
        as in a llama-server child started with them (and a plain `loraserve`'s demo
        adapters, switched on by `POST /lora-adapters` as the README says)."""
        out = dict(body)
        mix = [s for s in self.lora if s.scale != 0]
        if mix and "lora" not in out and self.engine_cfg is not None:
            ids = {spec.path: i for i, spec in enumerate(self.engine_cfg.lora)}
            out["lora"] = [{"id": ids[s.path], "scale": s.scale} for s in mix]
        for k, v in self.defaults.items():
            if k == "chat_template_kwargs" and isinstance(out.get(k), dict):
                out[k] = {**v, **out[k]}  # the request's own over the preset's
            else:
                out.setdefault(k, v)
        return out


def read_ini(text: str) -> dict[str, dict[str, str]]:
    """Sections of an INI text: name -> {key: value}; keys before any section go to ''."""
    sections: dict[str, dict[str, str]] = {"": {}}
    current = sections[""]
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1].strip(), {})
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise PresetError(f"line {n}: expected 'key = value' or '[section]': {raw!r}")
        current[key.strip()] = value.strip().strip('"')
    return sections


def key_args(key: str, value: str, parser: argparse.ArgumentParser) -> list[str]:
    """The command-line words of one INI key (`c = 4096` -> ['-c', '4096'])."""
    name = (
        key[len("LLAMA_ARG_") :].lower().replace("_", "-") if key.startswith("LLAMA_ARG_") else key
    )
    actions = parser._option_string_actions  # noqa: SLF001 (argparse has no public lookup)
    flag = next((f for f in (f"--{name}", f"-{name}") if f in actions), None)
    if flag is None:
        raise PresetError(f"unknown preset key {key!r}")
    action = actions[flag]
    if action.nargs == 0:
        if value.lower() in _TRUE:
            return [flag]
        negated = f"--no-{flag.lstrip('-')}"
        return [negated] if negated in actions else []
    return [flag, value]


def strip_router_args(argv: tuple[str, ...]) -> list[str]:
    """The router's command line less the flags the router keeps for itself."""
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in _ROUTER_VALUE_FLAGS:
            skip = "=" not in word
            continue
        if name not in _ROUTER_SWITCHES:
            out.append(word)
    return out


def _parse(argv: list[str]) -> ServerConfig:
    """`parse_server_args`, with its usage error as a `PresetError` (nothing printed). Offline,
    as llama-server lists its presets: a preset's `hf-repo` names a file of the cache (`POST
    /models` downloads one), listing never downloads."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse_server_args([*argv, "--offline"])
    except SystemExit:
        message = err.getvalue().strip().splitlines()
        why = message[-1].removeprefix("loraserve: error: ") if message else "bad flags"
        raise PresetError(why) from None


def load_catalog(cfg: ServerConfig) -> dict[str, Preset]:
    """Every model id the router serves, from `--models-dir` and `--models-preset`; a preset
    that cannot be served is listed with its `error` (it never stops the router)."""
    parser = build_parser()
    ini: dict[str, dict[str, str]] = {"": {}}
    if cfg.models_preset:
        ini = read_ini(Path(cfg.models_preset).read_text())
    common = ini.get("*", {})
    sections: dict[str, tuple[str, dict[str, str]]] = {}
    default = default_model_entry()
    if default is not None:
        sections[default[0]] = ("cache", {"model": default[1]})
        if not cfg.lora:  # its demo adapters, off, as a single-model start loads them
            from loraserve.adapters import DEMO_ADAPTERS, gguf_path

            demo = ",".join(f"{gguf_path(name)}:0" for name in DEMO_ADAPTERS)
            sections[default[0]][1]["lora-scaled"] = demo
    cache = cached_models()  # llama-server's download cache
    for name, path in cache.items():
        sections[name] = ("cache", {"model": path})
    if cfg.models_dir:
        for name, path in models_dir_entries(cfg.models_dir).items():
            sections[name] = ("models_dir", {"model": path})
    for name, keys in ini.items():
        if name in ("", "*"):
            continue
        source, base = sections.get(name, ("preset", {}))
        sections[name] = (source, {**base, **keys})
    merged_ini = [{**common, **keys} for name, keys in ini.items() if name not in ("", "*")]
    hidden = dedup_hidden(merged_ini, {n: p for n, p in cache.items() if sections[n][0] == "cache"})
    router_args = strip_router_args(cfg.argv)
    offline = "--offline" in router_args or os.environ.get("LLAMA_OFFLINE", "") not in ("", "0")
    base_cfg = _parse(router_args)
    presets = {}
    for name, (source, keys) in sections.items():
        merged = {**common, **keys}
        text = "".join(f"{k} = {v}\n" for k, v in keys.items())
        extra = {k: merged.pop(k) for k in ROUTER_KEYS if k in merged}
        try:
            argv = [w for k, v in merged.items() for w in key_args(k, v, parser)]
            hf = None if offline else pending_hf(argv)  # its other flags checked now
            words = argv if hf is None else [*hf[2], "-m", hf[0]]  # a stand-in path
            child = _parse([*words, *router_args])
            if child.model is None:
                raise PresetError("no model: give `model = PATH` (or use --models-dir)")
            presets[name] = dataclasses.replace(
                _preset(name, source, text, child, base_cfg, extra),
                args=("loraserve", *argv),
                listed=name not in hidden,
                removable=name in cache,
                hf=None if hf is None else hf[:2],
            )
            if hf is not None:  # no engine until its file is in (`router.pending`)
                presets[name] = dataclasses.replace(presets[name], engine_cfg=None)
        except PresetError as e:
            presets[name] = Preset(name, source, text, error=str(e), removable=name in cache)
    return _share_engines(presets)


def _preset(
    name: str, source: str, text: str, child: ServerConfig, base: ServerConfig, extra: dict
) -> Preset:
    defaults = {
        k: getattr(child, k) for k in _REQUEST_KEYS if getattr(child, k) != getattr(base, k)
    }
    if child.chat_template_kwargs != base.chat_template_kwargs:  # per request, over the engine's
        defaults["chat_template_kwargs"] = dict(child.chat_template_kwargs)
    engine = dataclasses.replace(
        child,
        model=os.path.realpath(os.path.expanduser(str(child.model))),
        lora=(),
        lora_init_without_apply=True,
        alias=(),
        chat_template_kwargs=base.chat_template_kwargs,
        **{k: getattr(base, k) for k in _REQUEST_KEYS},
    )
    lora = tuple(LoraSpec(os.path.realpath(s.path), s.scale) for s in child.lora)
    try:
        stop = float(extra.get("stop-timeout", DEFAULT_STOP_TIMEOUT_S))
    except ValueError:
        raise PresetError(f"stop-timeout: not a number: {extra['stop-timeout']!r}") from None
    on_start = str(extra.get("load-on-startup", "false")).lower() in _TRUE - {""}
    return Preset(
        name, source, text, engine_cfg=engine, lora=lora, defaults=defaults,
        load_on_startup=on_start, stop_timeout=stop,
    )  # fmt: skip


def _share_engines(presets: dict[str, Preset]) -> dict[str, Preset]:
    """Presets with one engine key get one engine configuration: the union of their adapters
    (scale 0, in name order), their names as its aliases."""
    groups: dict[ServerConfig, list[Preset]] = {}
    for p in presets.values():
        if p.engine_cfg is not None:
            groups.setdefault(p.engine_cfg, []).append(p)
    out = dict(presets)
    for cfg, members in groups.items():
        paths = dict.fromkeys(s.path for p in sorted(members, key=lambda p: p.name) for s in p.lora)
        engine = dataclasses.replace(
            cfg,
            lora=tuple(LoraSpec(path, 0.0) for path in paths),
            alias=(min(p.name for p in members),),
        )
        for p in members:
            out[p.name] = dataclasses.replace(p, engine_cfg=engine)
    return out
