"""The hybrid bench's generator (`bench.hybrid_shapes`, `bench.hybrid_synth`) writes what
llama.cpp's loaders read: applied to the metadata of llama.cpp's own `test-llama-archs`
template of each arch (`tests/data/archs/<arch>.json`), the tensor table it derives is the
recorded one (names and shapes; the loader-optional biases aside), and the file it writes
at those sizes loads in loraserve and runs. No llama.cpp, no large file: template sizes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import hybrid_shapes
from bench.hybrid_synth import write_f16

DATA = Path(__file__).resolve().parents[1] / "data" / "archs"
RECORD = {"mamba2": "recurrent/mamba2"}
# the template's layer kinds, in `bench.hybrid_shapes` letters
TEMPLATE_KINDS = {"lfm2": "Ac", "nemotron_h": "*M-", "falcon-h1": "H", "mamba2": "M",
                  "qwen35moe": "dA", "lfm2moe": "Ac", "qwen3next": "dA",
                  "nemotron_h_moe": "*ME"}  # fmt: skip


def template(arch: str) -> tuple[dict[str, Any], list[list[Any]]]:
    """The recorded template's first variant: its `<arch>.` keys and tensor table."""
    rec = json.loads((DATA / f"{RECORD.get(arch, arch)}.json").read_text())
    var = rec["variants"].get("moe") or next(iter(rec["variants"].values()))
    meta = {k[len(arch) + 1 :]: v for k, _, v in var["metadata"] if k.startswith(arch + ".")}
    return meta, var["tensors"]


def template_shape(arch: str) -> tuple[hybrid_shapes.Hybrid, int, int]:
    """The arch's `Hybrid` at the template's sizes (per-layer counts: their nonzero value)."""
    meta, _ = template(arch)
    real = hybrid_shapes.SHAPES[arch]
    keys = {}
    for k, v in real.keys.items():
        v = meta.get(k, v) if v != 0 else v  # mamba2's unused sizes: 0 as converted
        keys[k] = max(v) if isinstance(v, list) and k != "rope.dimension_sections" else v
    keys["attention.key_length"] = meta["attention.key_length"]
    if arch in ("qwen35moe", "qwen3next"):  # the template's attention layer is its second
        keys["full_attention_interval"] = 2
    s = dataclasses.replace(real, hidden=meta["embedding_length"], pattern=TEMPLATE_KINDS[arch],
                            tied=False, keys=keys)  # fmt: skip
    return s, meta["block_count"], meta["vocab_size"]


def optional(name: str) -> bool:
    """Tensors llama.cpp's loaders take when present (`TENSOR_NOT_REQUIRED`) that the real
    models lack: attention and FFN biases, rope factors."""
    required = name.endswith(("ssm_conv1d.bias", "ssm_dt.bias", "exp_probs_b.bias"))
    return name.endswith(".bias") and not required or name.startswith("rope_freqs")


@pytest.mark.parametrize("arch", sorted(hybrid_shapes.SHAPES))
def test_tensor_table_is_llama_cpp_template(arch: str) -> None:
    s, layers, vocab = template_shape(arch)
    _, recorded = template(arch)
    want = {n: tuple(shp) for n, shp, _ in recorded if not optional(n)}
    got = dict(hybrid_shapes.tensor_specs(arch, layers, vocab, s))
    for n in [n for n in want if n.endswith("ffn_gate_up_exps.weight")]:  # fused in the template
        e, f2, h = want.pop(n)
        want[n.replace("gate_up", "gate")] = want[n.replace("gate_up", "up")] = (e, f2 // 2, h)
    assert got == want


@pytest.mark.parametrize("arch", sorted(hybrid_shapes.SHAPES))
def test_generated_file_loads_and_runs(arch: str, tmp_path: Path) -> None:
    """The F16 writer's file at template sizes: convolution weights F32 as llama.cpp's
    ssm_conv needs them, loraserve loads it with the layer count, and a prompt gives finite
    logits."""
    from loraserve.engine.runner import BatchItem, ModelRunner
    from loraserve.model.loader import load_model

    s, layers, vocab = template_shape(arch)
    path = write_f16(tmp_path / f"{arch}.gguf", arch, layers, vocab, shape=s)
    import gguf

    # ggml_ssm_conv asserts F32 convolution weights (llama-server aborts on F16 ones)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    conv = [n for n in types if n.endswith(("conv1d.weight", "conv.weight"))]
    assert conv and all(types[n] == gguf.GGMLQuantizationType.F32 for n in conv)
    model = load_model(path)
    assert (model.config.arch, model.config.n_layers) == (arch, layers)
    runner = ModelRunner(model.decoder, 4, torch.float32)
    runner.ensure_capacity(2)
    logits = runner.forward([BatchItem([5, 9, 77, 3, 12], 0, 5, [0, 1], True, {})])
    assert logits.shape[-1] == vocab and torch.isfinite(logits).all()
