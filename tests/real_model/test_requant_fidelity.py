"""The real model requantized into other ggml types, against llama-server (recorded by
scripts/record_requant_reference.py into tests/data/requant_greedy.json).

For each type, the file llama-server answered on is either rebuilt here by loraserve's own
quantizer from the real Q4_K_M model (each tensor llama-quantize gave another type dequantized,
then quantized to that type: the test checks that the tensor bytes equal llama-quantize's, by
the recorded digest), or taken from the requantization cache the script fills (checked by the same
digest) -- made there first, as the script makes it, where the peer build's llama-quantize is
at hand (llama-imatrix too for the types that need an importance matrix; deterministic: the
files made so match the recorded digests) -- or the case skips. Teacher-forced on
llama-server's greedy tokens, loraserve (fp16 KV cache as llama-server's default) picks
llama-server's token wherever its top-1/top-2 log-probability gap is at least 0.5.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.model.gguf import GGUFFile
from loraserve.model.loader import load_model
from loraserve.model.quantize import QUANTIZERS, quantize
from tests.arch_models import tensor_digest

pytestmark = pytest.mark.real_model
REF = json.loads((Path(__file__).resolve().parents[1] / "data/requant_greedy.json").read_text())
FILES: dict[str, dict[str, Any]] = REF["files"]
GAP = 0.5
KV = torch.float16  # llama-server's default KV cache type, as recorded


def build_with_ours(source_path: Path, qtype: str, out: Path) -> Path | None:
    """The source model with each tensor llama-quantize changed the type of requantized by
    loraserve (dequantized, then `loraserve.model.quantize`), the others copied as
    llama-quantize copies them; None when some type has no quantizer of ours (the source
    itself for its own type). Written by the gguf package's writer, which takes raw blocks."""
    types = {n: int(t) for n, t in FILES[qtype]["types"].items()}
    with GGUFFile(source_path) as src:
        changed = {n for n, t in types.items() if src.tensors[n].ggml_type != t}
        if not changed:
            return source_path  # the baseline: the source's own type, not requantized
        if any(types[n] not in QUANTIZERS for n in changed):
            return None
        reader = GGUFReader(source_path)
        arch = reader.fields["general.architecture"].contents()
        writer = GGUFWriter(out, arch)
        for f in reader.fields.values():
            if f.name == "general.architecture" or f.name.startswith("GGUF."):
                continue
            sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
        for t in reader.tensors:
            shape = src.tensors[t.name].shape  # torch order
            if t.name in changed:
                raw = quantize(src.tensor(t.name).numpy(), types[t.name])  # [rows, row_bytes]
                writer.add_tensor(t.name, raw, raw_dtype=GGMLQuantizationType(types[t.name]))
            elif t.tensor_type == GGMLQuantizationType.F32:
                writer.add_tensor(t.name, np.asarray(t.data).reshape(shape))
            else:
                raw = np.asarray(src.raw(t.name)).reshape(shape[0], -1)  # [rows, row_bytes]
                writer.add_tensor(t.name, raw, raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("requant")


def requant_file(real_model_path: Path, qtype: str, tmp: Path) -> Path:
    """The file llama-server answered on: rebuilt by our quantizer where it can, else the
    requantization cache's; its tensors checked against the recorded digest."""
    path = build_with_ours(real_model_path, qtype, tmp / f"{qtype}.gguf")
    if path is None:
        path = real_model_path.parent / "requant" / f"gemma3-270m-{qtype}.gguf"
        if not path.exists():
            path = made_by_llama_quantize(real_model_path, qtype) or path
        if not path.exists():
            pytest.skip(f"{path} missing: python scripts/record_requant_reference.py")
    digest, _ = tensor_digest(path)
    assert digest == FILES[qtype]["tensors_sha256"], f"{qtype}: not the file llama-server ran"
    return path


def made_by_llama_quantize(real_model_path: Path, qtype: str) -> Path | None:
    """The cache's file of `qtype` made by scripts/record_requant_reference.py's own steps
    (llama-quantize --allow-requantize, with an importance matrix where the type needs one),
    or None without the peer build or its llama-imatrix (minutes for the IQ2/IQ1 types; once
    per machine)."""
    from bench.peer import find_quantize

    quantize = find_quantize()
    if quantize is None:
        return None
    script = Path(__file__).resolve().parents[2] / "scripts" / "record_requant_reference.py"
    spec = importlib.util.spec_from_file_location("record_requant_reference", script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        return mod.requantize(real_model_path, qtype, quantize)
    except SystemExit:  # a build with llama-quantize but not llama-imatrix: as without one
        return None


def forced_argmax(model: Any, cases: list[tuple[list[int], list[int]]]) -> list[int]:
    """Teacher forcing in one forward pass: each prompt followed by llama-server's tokens; our
    greedy pick at every position that predicts one of them."""
    runner = ModelRunner(model.decoder, 16, KV)
    items, block = [], 0
    for prompt, tokens in cases:
        seq = prompt + tokens[:-1]
        n_blocks = -(-len(seq) // runner.bs)
        items.append(
            BatchItem(seq, 0, len(seq), list(range(block, block + n_blocks)), True, {},
                      n_logits=len(tokens))
        )  # fmt: skip
        block += n_blocks
    runner.ensure_capacity(block)
    return runner.forward(items).argmax(-1).tolist()  # [sum of N]


@pytest.mark.parametrize("qtype", list(FILES))
def test_requantized_greedy_equals_llama_server(real_model_path: Path, tmp: Path, qtype: str):
    model = load_model(requant_file(real_model_path, qtype, tmp))
    recs = FILES[qtype]["records"]
    cases = [(model.tokenizer.encode(r["prompt"]), r["tokens"]) for r in recs]
    ours = forced_argmax(model, cases)
    # a position whose recorded second token is the one llama-server took is not decided: its
    # top-1 was a token ignore_eos kept it from taking (an end of generation)
    ref = [(t, g if s[0] != t else 0.0) for r in recs
           for t, g, s in zip(r["tokens"], r["gap"], r["second"], strict=True)]  # fmt: skip
    decided = [(k, t, o) for k, ((t, g), o) in enumerate(zip(ref, ours, strict=True)) if g >= GAP]
    wrong = [(k, t, o) for k, t, o in decided if t != o]
    assert len(decided) >= len(ref) // 3, "too few decided positions to mean anything"
    assert not wrong, f"{qtype}: {len(wrong)}/{len(decided)} decided positions differ: {wrong}"
