"""The architectures loraserve runs: every one of the breadth issue's list (#27, llama.cpp's
names) is supported and has llama-server's recorded answers (tests/data/archs), and a GGUF of
any other architecture is refused at load with one line naming it and the supported list."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loraserve.model.archs import UnsupportedModelError, supported
from loraserve.model.gguf_write import write_gguf
from loraserve.model.loader import load_model

ISSUE_27 = (
    "llama", "qwen3", "qwen3moe", "qwen2", "gemma3", "mistral3", "gpt-oss", "gemma2", "phi3",
    "glm4moe", "granite", "smollm3", "olmo2", "deepseek2", "qwen2moe", "granitemoe", "exaone4",
    "cohere2", "seed_oss", "glm4", "olmoe", "ernie4_5-moe", "hunyuan-moe", "starcoder2",
    "llama4", "minimax-m2",
)  # fmt: skip
DATA = Path(__file__).resolve().parents[2] / "data" / "archs"


def test_every_listed_architecture_is_supported_and_recorded() -> None:
    assert set(ISSUE_27) <= set(supported())
    for arch in ISSUE_27:
        assert (DATA / f"{arch}.json").is_file(), f"no recorded llama-server answers for {arch}"


@pytest.mark.parametrize("arch", ["bert", "rwkv7"])
def test_another_architecture_is_refused_in_one_line(tmp_path: Path, arch: str) -> None:
    meta = {"general.architecture": arch, "tokenizer.ggml.model": "test",
            "tokenizer.ggml.tokens": [f"tok_{i}" for i in range(8)]}  # fmt: skip
    path = write_gguf(tmp_path / "m.gguf", meta, {"token_embd.weight": np.zeros((8, 32), "f4")})
    with pytest.raises(UnsupportedModelError) as e:
        load_model(path)
    msg = str(e.value)
    assert "\n" not in msg and f"unsupported architecture {arch!r}" in msg
    assert msg.endswith("supported: " + ", ".join(supported()))
