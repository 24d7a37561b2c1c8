"""Tiny transformers models and the adapters the LoRA tests write: PEFT folders with random
non-zero A and B, llama.cpp GGUF LoRA files (q/k rows of ``lora_b`` permuted as
``convert_lora_to_gguf.py`` does for llama), the hand-merged float oracles, and our logits
under a mix."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from torch import nn

from loraserve.lora.registry import AdapterRegistry
from loraserve.model.hf import hf_to_gguf_name
from loraserve.model.loader import LoadedModel, load_model, permute_qk
from tests.tiny import hf_model, our_logits, write_gguf

IDS = [1, 5, 77, 300, 12, 9, 260, 261, 200, 150, 33, 7]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOL = 1e-4
R = 4  # the rank of `pairs`
MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip
Tiny = tuple[nn.Module, LoadedModel]


def tiny(tmp_path_factory: pytest.TempPathFactory, arch: str) -> Tiny:
    m = hf_model(arch)
    return m, load_model(write_gguf(tmp_path_factory.mktemp(arch) / "m.gguf", m, arch))


def peft_adapter(
    path: Path, m: nn.Module, *, seed: int = 1, r: int = 4, alpha: float = 8.0, **kw
) -> tuple[Path, nn.Module]:
    """Save a PEFT LoRA with random non-zero A and B; returns (folder, the PEFT model)."""
    kw.setdefault("target_modules", TARGETS)
    pm = get_peft_model(copy.deepcopy(m), LoraConfig(r=r, lora_alpha=alpha, **kw))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    pm.save_pretrained(path)
    return path, pm.eval()


def peft_pairs(folder: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """HF module parameter name (``model.layers.0.self_attn.q_proj.weight``) -> (A, B)."""
    sd = load_file(folder / "adapter_model.safetensors")
    return {
        k.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight"): (
            a,
            sd[k.replace("lora_A", "lora_B")],
        )
        for k, a in sd.items()
        if ".lora_A." in k
    }


def gguf_from_peft(path: Path, folder: Path, m: nn.Module, arch: str) -> Path:
    """The llama.cpp converter's output for a PEFT folder (uniform alpha, F32)."""
    conf = json.loads((folder / "adapter_config.json").read_text())
    pairs = {k.removesuffix(".weight"): ab for k, ab in peft_pairs(folder).items()}
    return gguf_from_pairs(path, m, arch, pairs, conf["lora_alpha"])


def gguf_from_pairs(path: Path, m: nn.Module, arch: str, pairs: dict, alpha: float) -> Path:
    """The llama.cpp converter's output for HF module name -> (A [r, in], B [out, r]): llama's
    q/k rows of B permuted, F32."""
    cfg, tensors = m.config, {}
    for module, (a, b) in pairs.items():
        name = hf_to_gguf_name(module + ".weight", arch)
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
            b = permute_qk(b, heads)
        tensors[name + ".lora_a"], tensors[name + ".lora_b"] = a, b
    return gguf_adapter(path, arch, tensors, alpha=alpha)


def random_pairs(m: nn.Module, r: int, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """HF module name -> random (A [r, in], B [out, r]) for every projection in MODULES."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in m.state_dict().items():
        module = name.removesuffix(".weight")
        if module.endswith(MODULES):
            o, i = p.shape
            out[module] = (
                torch.randn(r, i, generator=g) * 0.3,
                torch.randn(o, r, generator=g) * 0.3,
            )
    return out


def pairs(seed: int = 0, **over: tuple[tuple[int, ...], tuple[int, ...]]) -> dict:
    """GGUF LoRA tensors on the tiny llama (hidden 64, ffn 96), shapes overridable."""
    shapes = {"blk.0.attn_v.weight": ((R, 64), (32, R)), "blk.1.ffn_up.weight": ((R, 64), (96, R))}
    shapes.update(over)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (sa, sb) in shapes.items():
        out[name + ".lora_a"] = torch.randn(sa, generator=g) * 0.1
        out[name + ".lora_b"] = torch.randn(sb, generator=g) * 0.1
    return out


def gguf_adapter(
    path: Path,
    arch: str,
    tensors: Mapping[str, torch.Tensor | np.ndarray],
    alpha: float | None = 8.0,
    types: Mapping[str, GGMLQuantizationType] | None = None,
) -> Path:
    """Write a llama.cpp GGUF LoRA; ``types`` quantizes/converts the named tensors."""
    from gguf.quants import quantize

    w = GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_name(path.stem)
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", alpha)
    for name, t in tensors.items():
        arr = t.numpy() if isinstance(t, torch.Tensor) else t
        qt = (types or {}).get(name)
        if qt is None:
            w.add_tensor(name, arr.astype(np.float32))
        else:
            w.add_tensor(name, quantize(arr.astype(np.float32), qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def f16_adapter(
    path: Path,
    shapes: Mapping[str, tuple[int, ...]],
    seed: int,
    rank: int,
    halves: bool,
    skip: str = "",
) -> None:
    """A GGUF LoRA on every 2-D target of ``shapes`` (but names containing ``skip``) whose
    values are float16, stored as F16 (``halves``) or as F32 (the same values)."""
    g = torch.Generator().manual_seed(seed)
    tensors, types = {}, {}
    for name, shape in sorted(shapes.items()):
        if len(shape) != 2 or (skip and skip in name):
            continue
        out, inp = shape
        for part, s in (("lora_a", (rank, inp)), ("lora_b", (out, rank))):
            t = (torch.randn(s, generator=g) * 0.2).half().numpy()
            tensors[f"{name}.{part}"] = t.astype(np.float32)
            if halves:
                types[f"{name}.{part}"] = GGMLQuantizationType.F16
    gguf_adapter(path, "gemma3", tensors, alpha=float(rank), types=types)


def merged(m: nn.Module, adapters: list[tuple[Path, float]]) -> nn.Module:
    """A copy of ``m`` with W += s · (alpha/r) · B A for every (PEFT folder, scale)."""
    out = copy.deepcopy(m)
    params = dict(out.named_parameters())
    for folder, s in adapters:
        conf = json.loads((folder / "adapter_config.json").read_text())
        factor = conf["lora_alpha"] / conf["r"]
        for name, (a, b) in peft_pairs(folder).items():
            params[name].data += s * factor * (b @ a)
    return out


def lora_logits(
    model: LoadedModel, reg: AdapterRegistry, ids: list[int], mix: dict[int, float], chunk: int = 5
) -> torch.Tensor:
    """Logits [T, V] under ``mix``: a prefill chunk, then one-token decodes, via the runner."""
    return our_logits(model, ids, chunk, mix, reg.build_delta)


def close(ours: torch.Tensor, ref: torch.Tensor, base: torch.Tensor | None = None) -> None:
    diff = (ours - ref).abs().max().item()
    assert diff <= TOL, f"max abs logit diff {diff}"
    if base is not None:  # the adapter visibly changes the logits: the test is not vacuous
        assert (ref - base).abs().max().item() > 0.05


def moe_adapter(path: Path, m: nn.Module, seed: int, r: int = 4) -> tuple[Path, dict]:
    """A GGUF LoRA on the tiny Mixtral: stacked experts, attn_q (permuted B) and output.

    Returns the file and the HF-layout pairs {gguf name: (A, B)}.
    """
    cfg, g = m.config, torch.Generator().manual_seed(seed)
    e, h, f = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g) * 0.1

    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for i in range(cfg.num_hidden_layers):
        pairs[f"blk.{i}.ffn_gate_exps.weight"] = (rnd(e, r, h), rnd(e, f, r))
        pairs[f"blk.{i}.ffn_up_exps.weight"] = (rnd(e, r, h), rnd(e, f, r))
        pairs[f"blk.{i}.ffn_down_exps.weight"] = (rnd(e, r, f), rnd(e, h, r))
        pairs[f"blk.{i}.attn_q.weight"] = (rnd(r, h), rnd(h, r))
    pairs["output.weight"] = (rnd(r, h), rnd(cfg.vocab_size, r))
    tensors = {}
    for name, (a, b) in pairs.items():
        if name.endswith("attn_q.weight"):
            b = permute_qk(b, cfg.num_attention_heads)
        tensors[name + ".lora_a"], tensors[name + ".lora_b"] = a, b
    return gguf_adapter(path, "llama", tensors, alpha=2.0 * r), pairs


def merged_moe(m: nn.Module, adapters: list[tuple[dict, float]]) -> nn.Module:
    """A copy of the HF Mixtral with every adapter's s · (alpha/r) · B A added (alpha = 2r)."""
    out = copy.deepcopy(m)
    p = dict(out.named_parameters())
    f = m.config.intermediate_size
    for pairs, s in adapters:
        for name, (a, b) in pairs.items():
            d = 2.0 * s * (b @ a)  # [E, out, in] or [out, in]
            blk = name.split(".")[1]
            if name == "output.weight":
                p["lm_head.weight"].data += d
            elif "attn_q" in name:
                p[f"model.layers.{blk}.self_attn.q_proj.weight"].data += d
            elif "down_exps" in name:
                p[f"model.layers.{blk}.mlp.experts.down_proj"].data += d
            else:
                rows = slice(0, f) if "gate_exps" in name else slice(f, 2 * f)
                p[f"model.layers.{blk}.mlp.experts.gate_up_proj"].data[:, rows] += d
    return out


def reference_content_id(a: Any, h: Any) -> str:
    """An adapter's content id as defined, from its held tensors, with the hash object ``h``
    (blake3, or hashlib.sha256 as the fallback): per target in name order, its header line,
    then A and B [out, r] as float32 for a pair held so; then the halves held (A, B's tiles,
    B's tail) of every float16 pair, in name order."""
    halves = []
    for t in sorted(a.weights):
        w = a.weights[t]
        tag = "|f16" if w.a16 is not None else ""
        h.update(f"{t}|{w.a_shape}|{w.b_shape}|{w.factor!r}{tag}\n".encode())
        if w.a16 is not None:
            halves += [w.a16, w.bt16, w.tail16]
            continue
        for x in (w.a, w.b):
            h.update(x.contiguous().numpy().tobytes())
    if halves:
        h.update(b"halves\n")
        for x in halves:
            h.update(x.contiguous().numpy().tobytes())
    return h.hexdigest()
