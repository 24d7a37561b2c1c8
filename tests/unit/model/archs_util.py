"""The recorded architectures (tests/data/archs/<arch>.json, scripts/record_arch_cases.py): their
records, the model files llama-server answered on rebuilt from them, teacher-forced logits, and a
random adapter on every projection with the check that it equals its merge: the toolkit of
test_archs.py and of the tests that run further checks on the same records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from loraserve.engine.engine import Engine
from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.engine.sampling.params import SamplingParams
from loraserve.model.loader import load_model
from tests.arch_models import file_sha256, tensor_digest, write_model

DATA = Path(__file__).resolve().parents[2] / "data" / "archs"
RECORDS = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}
VOCAB = RECORDS.pop("test_vocab", None)
VARIANTS = [(a, v) for a, r in RECORDS.items() for v in r["variants"]]
GAP = 0.5
KV = torch.float16  # llama-server's default KV cache type (-ctk/-ctv f16), as recorded
PROBS = SamplingParams(temperature=0.0, n_probs=2)
_FILES: dict[tuple[str, str, str], Path] = {}


def case_id(p: tuple[str, ...]) -> str:
    """A parametrized case's id: its parts joined by dashes."""
    return "-".join(p)


def load(path: Path, key: str) -> Any:
    """The model at ``path``, told the context llama-server ran it with (phi3's long factors)."""
    model = load_model(path)
    model.decoder = model.decoder.for_context(int(RECORDS[key].get("n_ctx", 256)))
    return model


def model_file(tmp: Path, arch: str, variant: str, qtype: str) -> Path:
    """The model llama-server answered on, rebuilt here; its bytes checked against the record."""
    key = (arch, variant, qtype)
    if key not in _FILES:
        rec = RECORDS[arch]["variants"][variant]
        files = rec["files"][qtype]
        types = None if qtype == "F32" else {k: int(t) for k, t in files["types"].items()}
        path = write_model(rec, tmp / f"{arch}-{variant}-{qtype}.gguf", types)
        if qtype == "F32":
            assert file_sha256(path) == files["sha256"], "the F32 file is not the one recorded"
        assert tensor_digest(path)[0] == files["tensors_sha256"], (
            f"{qtype}: our quantizer's bytes differ from llama-quantize's"
        )
        _FILES[key] = path
    return _FILES[key]


def forced_logits(
    runner: ModelRunner, cases: list[dict[str, Any]], mix: dict[int, float] | None = None
) -> torch.Tensor:
    """Teacher forcing in one forward pass: each case's prompt followed by llama-server's
    tokens, the logits [sum of N, V] of every position that predicts one of those N tokens
    (a row's logits do not depend on the batch: the engine's promise, tested in test_archs)."""
    items, block = [], 0
    for c in cases:
        seq = c["prompt"] + c["tokens"][:-1]
        n_blocks = -(-len(seq) // runner.bs)
        blocks = list(range(block, block + n_blocks))
        block += n_blocks
        items.append(
            BatchItem(seq, 0, len(seq), blocks, True, mix or {}, n_logits=len(c["tokens"]))
        )
    runner.ensure_capacity(block)
    return runner.forward(items)


def check_equals_merged(eng: Engine, base: Any, merged: Any, cases: list[dict[str, Any]],
                        scale: float) -> None:  # fmt: skip
    """Adapter 0 at `scale` in `eng` answers the teacher-forced `cases` as the `merged` model
    does (log-probabilities within 2e-3), and the adapter changes the `base` model's answers."""
    got = forced_logits(eng.core.runner, cases, {0: scale}).log_softmax(-1)
    want = forced_logits(ModelRunner(merged.decoder, 16, torch.float32), cases).log_softmax(-1)
    ref = forced_logits(ModelRunner(base.decoder, 16, torch.float32), cases).log_softmax(-1)
    assert (ref - want).abs().max() > 0.01, "the adapter changes nothing: no test"
    assert (got - want).abs().max() < 2e-3


def random_adapter(rec: dict[str, Any], seed: int) -> dict[str, Any]:
    """Random LoRA pairs (HF layout: A [r, in], B [out, r]) on every 2-D projection, the
    routers included (llama.cpp's ``build_moe_ffn`` applies LoRA to ``ffn_gate_inp``, qwen2moe's
    to the 1-D shared-expert gate ``ffn_gate_inp_shexp``: B [1, r]), and on every stacked expert
    tensor (routed experts: A [E, r, in], B [E, out, r], as ``build_lora_mm_id`` applies them)."""
    g = torch.Generator().manual_seed(seed)
    pairs = {}
    for name, shape, _ in rec["tensors"]:
        stem = name.split(".")[-2] if name.startswith("blk.") else ""
        if name.endswith(".bias"):  # gpt-oss's 2-D expert biases are no LoRA target
            continue
        if stem == "ffn_gate_inp_shexp":  # [hidden]: one output row
            pairs[name] = (torch.randn(4, shape[-1], generator=g) * 0.05,
                           torch.randn(1, 4, generator=g) * 0.05)  # fmt: skip
        elif len(shape) == 2 and stem.startswith(("attn_q", "attn_k", "attn_v", "attn_output",
                                                   "ffn_gate", "ffn_up", "ffn_down")):  # fmt: skip
            if stem.endswith("_norm"):
                continue
            a = torch.randn(4, shape[1], generator=g) * 0.05
            b = torch.randn(shape[0], 4, generator=g) * 0.05
            pairs[name] = (a, b)
        elif len(shape) == 3 and stem in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                                            "ffn_gate_up_exps"):  # fmt: skip
            a = torch.randn(shape[0], 4, shape[2], generator=g) * 0.05
            b = torch.randn(shape[0], shape[1], 4, generator=g) * 0.05
            pairs[name] = (a, b)
    return pairs
