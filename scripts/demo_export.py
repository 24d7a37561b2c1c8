"""The demo adapters' PEFT folders written as llama.cpp GGUF LoRA files."""

import json
from pathlib import Path

import numpy as np
from demo_prompts import GGUF_TENSOR_NAMES

# ---------------------------------------------------------------------------------------
# GGUF export
# ---------------------------------------------------------------------------------------


def gguf_tensor_name(peft_key: str) -> tuple[str, str]:
    """Map a PEFT key to (llama.cpp base tensor name, "a" or "b").

    ``base_model.model.model.layers.3.mlp.up_proj.lora_A.weight``
    -> ``("blk.3.ffn_up.weight", "a")``
    """
    prefix = "base_model.model.model.layers."
    if not peft_key.startswith(prefix):
        raise ValueError(f"unexpected PEFT tensor {peft_key!r}")
    rest = peft_key[len(prefix) :]
    layer, _, rest = rest.partition(".")
    for which in ("A", "B"):
        suffix = f".lora_{which}.weight"
        if rest.endswith(suffix):
            module = rest[: -len(suffix)]
            if module not in GGUF_TENSOR_NAMES:
                break
            return f"blk.{int(layer)}.{GGUF_TENSOR_NAMES[module]}.weight", which.lower()
    raise ValueError(f"unexpected PEFT tensor {peft_key!r}")


def export_gguf(peft_folder: Path, out_path: Path, name: str) -> None:
    """Write ``peft_folder`` as a llama.cpp GGUF LoRA adapter (F16), as convert_lora_to_gguf.py.

    Metadata written (the converter's keys, in its order, for a Gemma 3 base):
    general.architecture, general.type = "adapter", adapter.type = "lora", general.name,
    adapter.lora.alpha (float32), general.quantization_version. Tensors:
    ``blk.N.<t>.weight.lora_a`` with PEFT A's numpy shape [rank, in] and ``.lora_b`` with
    B's [out, rank] (ggml ``ne`` is the reverse), in PEFT's tensor order, a before b. With
    ``name`` = the capitalized folder name (as the converter derives it), the file is byte
    for byte what ``convert_lora_to_gguf.py --outtype f16`` writes for this folder.
    """
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((peft_folder / "adapter_config.json").read_text())
    if cfg.get("use_rslora") or cfg.get("use_dora"):
        raise ValueError("rsLoRA / DoRA adapters have no llama.cpp GGUF equivalent")
    state = load_file(peft_folder / "adapter_model.safetensors")
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in state.items():
        base_name, which = gguf_tensor_name(key)
        pairs.setdefault(base_name, {})[which] = value

    writer = gguf.GGUFWriter(out_path, arch="gemma3")
    for base_name, ab in pairs.items():
        a, b = ab["a"], ab["b"]
        assert a.ndim == 2 and b.ndim == 2 and a.shape[0] == b.shape[1], base_name
        for suffix, arr in ((".lora_a", a), (".lora_b", b)):
            writer.add_tensor(
                base_name + suffix,
                np.ascontiguousarray(arr.astype(np.float16)),
                raw_dtype=gguf.GGMLQuantizationType.F16,
            )
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_name(name)
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(cfg["lora_alpha"]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
