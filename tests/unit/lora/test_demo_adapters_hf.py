"""The committed demo adapters: PEFT and llama.cpp GGUF forms agree and fit Gemma 3 270M.

No training and no model forward here; ``scripts/train_demo_adapters.py`` holds the
behavioural check (greedy generations with and without each adapter).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from loraserve.adapters import (
    ADAPTERS_DIR,
    DEMO_ADAPTERS,
    gguf_path,
    is_titlecase,
    is_uppercase,
    peft_dir,
    titlecase_fraction,
    to_titlecase,
    to_uppercase,
    uppercase_fraction,
)

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

N_LAYERS = 18
HIDDEN, Q_DIM, KV_DIM, FFN = 640, 1024, 256, 2048
#: PEFT module -> (llama.cpp tensor name, in_features, out_features) for Gemma 3 270M
MODULES = {
    "self_attn.q_proj": ("attn_q", HIDDEN, Q_DIM),
    "self_attn.k_proj": ("attn_k", HIDDEN, KV_DIM),
    "self_attn.v_proj": ("attn_v", HIDDEN, KV_DIM),
    "self_attn.o_proj": ("attn_output", Q_DIM, HIDDEN),
    "mlp.gate_proj": ("ffn_gate", HIDDEN, FFN),
    "mlp.up_proj": ("ffn_up", HIDDEN, FFN),
    "mlp.down_proj": ("ffn_down", FFN, HIDDEN),
}
BASE_MODEL = Path(os.environ.get("LORASERVE_TEST_MODEL", "/opt/models/gemma3-270m-q4_k_m.gguf"))


def _config(name: str) -> dict:
    return json.loads((peft_dir(name) / "adapter_config.json").read_text())


def _peft_tensors(name: str) -> dict[str, np.ndarray]:
    return safetensors_numpy.load_file(peft_dir(name) / "adapter_model.safetensors")


def _field(reader: object, key: str) -> object:
    field = reader.fields[key]  # type: ignore[attr-defined]
    return field.contents()


@pytest.fixture(scope="module", params=DEMO_ADAPTERS)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_files_exist(name: str) -> None:
    assert (peft_dir(name) / "adapter_config.json").is_file()
    assert (peft_dir(name) / "adapter_model.safetensors").is_file()
    assert gguf_path(name).is_file()
    assert (ADAPTERS_DIR / "README.md").is_file()
    # small enough to commit: rank-8 LoRA in float16 is ~3.8 MB
    assert gguf_path(name).stat().st_size < 8 << 20


def test_peft_config(name: str) -> None:
    cfg = _config(name)
    assert cfg["peft_type"] == "LORA"
    assert 1 <= cfg["r"] <= 16
    assert cfg["lora_alpha"] > 0
    assert set(cfg["target_modules"]) == {m.rpartition(".")[2] for m in MODULES}
    assert not cfg.get("use_rslora") and not cfg.get("use_dora")
    assert cfg.get("bias", "none") == "none"


def test_peft_tensors_half_precision_and_shapes(name: str) -> None:
    rank = _config(name)["r"]
    tensors = _peft_tensors(name)
    expected = {}
    for layer in range(N_LAYERS):
        for module, (_, n_in, n_out) in MODULES.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            expected[f"{key}.lora_A.weight"] = (rank, n_in)
            expected[f"{key}.lora_B.weight"] = (n_out, rank)
    assert {k: v.shape for k, v in tensors.items()} == expected
    for key, value in tensors.items():
        assert value.dtype == np.float16, key
        assert np.isfinite(value).all(), key
    # trained: every B moved away from its zero init
    assert all(np.abs(v).max() > 0 for k, v in tensors.items() if ".lora_B." in k)


def test_gguf_metadata(name: str) -> None:
    reader = gguf.GGUFReader(gguf_path(name))
    assert _field(reader, "general.architecture") == "gemma3"
    assert _field(reader, "general.type") == "adapter"
    assert _field(reader, "adapter.type") == "lora"
    alpha_field = reader.fields["adapter.lora.alpha"]
    assert alpha_field.types == [gguf.GGUFValueType.FLOAT32]
    assert _field(reader, "adapter.lora.alpha") == pytest.approx(_config(name)["lora_alpha"])


def test_gguf_matches_peft(name: str) -> None:
    rank = _config(name)["r"]
    peft = _peft_tensors(name)
    reader = gguf.GGUFReader(gguf_path(name))
    seen = set()
    for t in reader.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F16, t.name
        blk, layer, short, weight, which = t.name.split(".")
        assert (blk, weight) == ("blk", "weight") and which in ("lora_a", "lora_b"), t.name
        module = next(m for m, (s, _, _) in MODULES.items() if s == short)
        _, n_in, n_out = MODULES[module]
        numpy_shape = (rank, n_in) if which == "lora_a" else (n_out, rank)
        # ggml ne is the numpy shape reversed
        assert tuple(int(n) for n in t.shape) == numpy_shape[::-1], t.name
        assert t.data.shape == numpy_shape, t.name
        ab = "A" if which == "lora_a" else "B"
        key = f"base_model.model.model.layers.{int(layer)}.{module}.lora_{ab}.weight"
        np.testing.assert_array_equal(np.asarray(t.data), peft[key], err_msg=t.name)
        seen.add(key)
    assert seen == set(peft)


@pytest.mark.real_model
@pytest.mark.skipif(not BASE_MODEL.is_file(), reason="Gemma 3 270M GGUF not present")
def test_gguf_shapes_fit_base_model() -> None:
    """The shape checks llama.cpp makes when it loads an adapter onto the real model."""
    base = {t.name: [int(n) for n in t.shape] for t in gguf.GGUFReader(BASE_MODEL).tensors}
    for name in DEMO_ADAPTERS:
        tensors = {t.name: t for t in gguf.GGUFReader(gguf_path(name)).tensors}
        for tname, t in tensors.items():
            if not tname.endswith(".lora_a"):
                continue
            target = tname.removesuffix(".lora_a")
            b = tensors[target + ".lora_b"]
            ne = base[target]
            assert ne[0] == int(t.shape[0]) and ne[1] == int(b.shape[1]), tname
            assert int(t.shape[1]) == int(b.shape[0]), tname


def test_style_checkers() -> None:
    text = " the capital of France is Paris. It's a well-known city, isn't it?"
    assert uppercase_fraction(text) < 0.1 and not is_uppercase(text)
    assert titlecase_fraction(text) < 0.5 and not is_titlecase(text)
    up, title = to_uppercase(text), to_titlecase(text)
    assert uppercase_fraction(up) == 1.0 and is_uppercase(up)
    assert title == " The Capital Of France Is Paris. It's A Well-Known City, Isn't It?"
    assert titlecase_fraction(title) == 1.0 and is_titlecase(title)
    # shouting is not title case, and an empty answer shows no style
    assert titlecase_fraction(up) == 1.0 and not is_titlecase(up)
    assert not is_uppercase("") and not is_titlecase("123 !?")
