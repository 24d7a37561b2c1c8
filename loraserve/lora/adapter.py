"""Load LoRA adapters (llama.cpp GGUF LoRA files and PEFT folders) into one in-memory form.

Every target is addressed by its GGUF base tensor name and holds float32 ``A`` [r, in] and
``B`` [out, r] (a pair stored as float16: its halves alone, `lora.weight.LoraWeight`) in
Hugging Face layout (the layout the decoder runs in), or [E, r, in] /
[E, out, r] for stacked MoE experts, plus the factor that turns a user scale into the
weight of ``(x Aᵀ) Bᵀ``: ``alpha / r`` (``alpha / sqrt(r)`` for rsLoRA; 1 when a GGUF file
has no alpha). Loading either fully succeeds or raises `AdapterError`. LoRA on
``token_embd.weight`` (llama.cpp adds it to the embedding lookup) is refused: the decoder
has no embedding hook.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

try:  # BLAKE3: ~5x sha256's speed here (0.6 vs 2.9 ms of CPU for a 6 MB adapter)
    from blake3 import blake3 as _hasher
except ImportError:  # an install without it: sha256 (other ids, the same guarantees)
    from hashlib import sha256 as _hasher

from loraserve.lora.adapter_checks import EMBED, AdapterError, Held, all_finite, hold
from loraserve.lora.content_ids import ContentIds, Seen
from loraserve.lora.peft_experts import Found, expert_module, stack_experts
from loraserve.lora.peft_targets import split_module
from loraserve.lora.read_gguf import Pairs, open_gguf, read_gguf
from loraserve.lora.weight import LoraWeight
from loraserve.model.config import ModelConfig
from loraserve.model.hf import hf_to_gguf_name

_PEFT_KEY = re.compile(r"^(.+)\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B)(?:\.weight)?$")


@dataclass
class Adapter:
    """A loaded adapter. ``id`` is assigned by the registry (-1 until registered)."""

    name: str
    path: Path
    content_id: str  # BLAKE3 hex of the targets' names, shapes, factors and weights
    weights: dict[str, LoraWeight]  # GGUF base tensor name -> pair
    id: int = -1
    metadata: dict[str, Any] = field(default_factory=dict)
    pinned: bool = False  # never evicted (`lora.tiers`)
    last_used: int = 0  # the registry's use clock when a request last named it
    alora: tuple[int, ...] = ()  # aLoRA invocation tokens: active from their last occurrence
    _sized: int | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "weights":  # new weights (or none: evicted): their size is counted anew
            object.__setattr__(self, "_sized", None)
        object.__setattr__(self, name, value)

    @property
    def nbytes(self) -> int:
        """Bytes its weights hold in memory (0 on disk), summed once per weights dict. The
        count is kept, never the dict: an evicted adapter's tensors are freed at once
        (holding the dict here kept every evicted adapter's weights alive)."""
        if not self.weights:
            return 0
        if self._sized is None:
            self._sized = sum(p.nbytes for p in self.weights.values())
        return self._sized


def load_adapter(
    path: str | Path,
    model_config: ModelConfig,
    base_shapes: dict[str, tuple[int, ...]],
    ids: ContentIds | None = None,
) -> Adapter:
    """Read a GGUF LoRA file or a PEFT folder and check it against the model.

    ``base_shapes`` maps each adaptable base tensor name to its shape: (out, in) for
    projections, (E, out, in) for stacked experts. Raises `AdapterError` for anything that
    does not fit (architecture, target names, shapes, unsupported features, corrupt files).
    ``ids``: the content ids of files read before (`lora.content_ids`), for this model.
    """
    path = Path(path)
    if not path.exists():
        raise AdapterError(f"{path}: no such adapter file or folder")
    seen = ids.before_read(path) if ids is not None else None
    try:  # a crafted file is refused with its reason, never with Python's own error
        if path.is_dir():
            name, meta, pairs = _read_peft(path, model_config, base_shapes)
            return _adapter(path, name, meta, pairs, all_finite(pairs), base_shapes, ids, seen)
        with open_gguf(path) as gg:  # its pairs are views of the mapping until held
            name, meta, pairs, finite = read_gguf(gg, path, model_config, base_shapes)
            return _adapter(path, name, meta, pairs, finite, base_shapes, ids, seen)
    except (TypeError, ArithmeticError, RecursionError, re.error, KeyError, IndexError) as e:
        raise AdapterError(f"{path}: unusable adapter: {type(e).__name__}: {e}") from None


def _adapter(
    path: Path,
    name: str,
    meta: dict[str, Any],
    pairs: Pairs,
    finite: bool,
    base_shapes: dict[str, tuple[int, ...]],
    ids: ContentIds | None = None,
    seen: Seen | None = None,
) -> Adapter:
    """The pairs checked and held (each tensor copied once at most), and the content id
    hashed from the values as held (`_content_id`), or the one ``ids`` holds for the
    unchanged file (``seen`` before the read)."""
    held, arena = hold(path, pairs, base_shapes, finite)
    if not held:
        raise AdapterError(f"{path}: the adapter has no LoRA tensors")
    weights = {t: w for t, (w, _) in held.items()}
    if ids is not None and seen is not None:
        cid = ids.content_id(seen, lambda: _content_id(held, arena))
    else:
        cid = _content_id(held, arena)
    return Adapter(name, path, cid, weights, metadata=meta)


def _read_peft(
    path: Path, cfg: ModelConfig, base_shapes: dict[str, tuple[int, ...]]
) -> tuple[str, dict[str, Any], Pairs]:
    from safetensors import safe_open

    from loraserve.lora.validate import read_peft_config

    cfg_file, st_file = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not cfg_file.is_file():
        raise AdapterError(f"{path}: a PEFT adapter folder needs adapter_config.json")
    if not st_file.is_file():
        raise AdapterError(f"{path}: adapter_model.safetensors is missing")
    conf = read_peft_config(path)  # bounded, its values and patterns checked
    if conf.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{cfg_file}: not a LoRA adapter (peft_type must be 'LORA')")
    for flag in ("use_dora", "lora_bias", "fan_in_fan_out"):
        if conf.get(flag):
            raise AdapterError(f"{cfg_file}: {flag}=true is not supported")
    halves: dict[str, dict[str, torch.Tensor]] = {}
    wide: set[str] = set()  # modules with a tensor not stored as float16
    try:
        with safe_open(str(st_file), "pt") as st:
            for key in st.keys():
                if key.endswith(".base_layer.weight"):
                    continue  # PEFT's copy of a base weight; llama.cpp's converter skips it too
                m = _PEFT_KEY.match(key)
                if m is None:
                    raise AdapterError(f"{st_file}: unexpected tensor {key!r} (not lora_A/lora_B)")
                module, part = m.groups()
                if part.startswith("lora_embedding"):
                    raise AdapterError(
                        f"{st_file}: {key!r} is a LoRA on {EMBED!r}, which is not supported"
                    )
                t = st.get_tensor(key)  # its own copy: held as it is when it can be
                if t.dtype != torch.float16:
                    wide.add(module)
                halves.setdefault(module, {})[part] = t if t.dtype == torch.float16 else t.float()
    except AdapterError:
        raise
    except Exception as e:  # safetensors raises its own error types on corrupt files
        raise AdapterError(f"{st_file}: cannot read safetensors: {e}") from None
    pairs: Pairs = {}
    found: Found = {}  # per-expert modules (transformers 4's MoE layout), by layer and part
    for module, ab in halves.items():
        if len(ab) != 2:
            missing = "lora_B" if "lora_A" in ab else "lora_A"
            raise AdapterError(f"{st_file}: {module}.{missing} is missing (its pair is present)")
        key = _module_key(module)
        a, b = ab["lora_A"], ab["lora_B"]
        r = int(_lookup(conf, "rank_pattern", key, conf.get("r", 8)))
        alpha = float(_lookup(conf, "alpha_pattern", key, conf.get("lora_alpha", 8)))
        factor = alpha / math.sqrt(r) if conf.get("use_rslora") else alpha / r
        if (per_expert := expert_module(key)) is not None:  # stacked after the loop
            layer, e, part = per_expert
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != r:
                raise AdapterError(f"{st_file}: {module}: A {tuple(a.shape)}, expected rank {r}")
            found.setdefault((layer, part), {})[e] = (a, b, factor, module not in wide)
            continue
        try:  # a module adapting several tensors or a stacked parameter (`lora.peft_targets`)
            split = split_module(key, a, b, cfg, base_shapes, conf.get("target_parameters") or [])
        except ValueError as e:
            raise AdapterError(f"{st_file}: {module!r}: {e}") from None
        if split is not None:
            for target, pa, pb in split:
                if pa.shape[-2] != r:
                    raise AdapterError(f"{st_file}: {module}: rank {pa.shape[-2]}, expected {r}")
                pairs[target] = (pa, pb, factor, module not in wide, False)
            continue
        target = hf_to_gguf_name(key + ".weight", cfg.arch)
        if target is None:
            raise AdapterError(f"{st_file}: {module!r} is not a known base tensor")
        if a.dim() != 2 or a.shape[0] != r:
            raise AdapterError(
                f"{st_file}: {module}.lora_A has shape {tuple(a.shape)}, expected rank {r}"
            )
        pairs[target] = (a, b, factor, module not in wide, False)
    try:
        pairs.update(stack_experts(found, cfg, base_shapes))
    except ValueError as e:
        raise AdapterError(f"{st_file}: {e}") from None
    return path.name, {"adapter_config": conf}, pairs


def _module_key(module: str) -> str:
    """``base_model.model.model.layers.0.self_attn.q_proj`` -> ``model.layers.0...q_proj``."""
    key = module.removeprefix("base_model.model.")
    return re.sub(r"^model\.language_model\.", "model.", key)


def _lookup(conf: dict[str, Any], field_name: str, key: str, default: Any) -> Any:
    """PEFT's rank/alpha pattern value for module ``key`` (`lora.validate.pattern_value`)."""
    from loraserve.lora.validate import pattern_value

    return pattern_value(conf, field_name, key, default)


def _content_id(held: Held, arena: torch.Tensor | None) -> str:
    """BLAKE3 (`_hasher`) of each target's name, shapes, factor and weights as stored: per
    target in name order its line, then a pair held as float32 its values; then the
    ``arena`` of the pairs held as float16 (tagged: half the bytes, one value each), their
    halves in one update (A, B's tiles and tail per target, in name order:
    `adapter_checks.hold`; one pass over the bytes just copied, where an update a tensor
    cost ~1.9 ms more of a ~5 ms sha256). The lines between two tensors' bytes go in one
    update (the same stream). The same values stored both ways get two ids: KV not shared,
    never wrongly hit. The lines give every pair's shapes, so the bytes after them are
    read one way only."""
    h = _hasher()
    lines: list[str] = []
    for t in sorted(held):
        w, pair = held[t]
        tag = "|f16" if w.a16 is not None else ""
        lines.append(f"{t}|{w.a_shape}|{w.b_shape}|{w.factor!r}{tag}\n")
        if pair:  # the buffers themselves (all are contiguous); none in the arena
            h.update("".join(lines).encode())
            lines.clear()
            for x in pair:
                h.update(x.numpy().data.cast("B"))
    if arena is not None:
        lines.append("halves\n")
    h.update("".join(lines).encode())
    if arena is not None:
        h.update(arena.numpy().data.cast("B"))
    return h.hexdigest()
