"""The delta-net records (tests/data/archs/deltanet/, scripts/record_deltanet_heads.py), their
models rebuilt from the specs, and sequences run in chosen prefill chunks, batched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.model.loader import LoadedModel, load_model
from tests.arch_models import tensor_digest, write_model

DATA = Path(__file__).resolve().parents[2] / "data" / "archs" / "deltanet"
RECORDS = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}
_MODELS: dict[tuple[str, str], LoadedModel] = {}


def variant(arch: str) -> dict[str, Any]:
    """The record's one variant of ``arch``."""
    return next(iter(RECORDS[arch]["variants"].values()))


def model(tmp: Path, arch: str, qtype: str) -> LoadedModel:
    """The recorded model of ``arch`` in ``qtype``, rebuilt once; its tensors checked."""
    if (arch, qtype) not in _MODELS:
        rec = variant(arch)
        types = (
            None if qtype == "F32" else {k: int(t) for k, t in rec["files"][qtype]["types"].items()}
        )
        path = write_model(rec, tmp / f"{arch}-{qtype}.gguf", types)
        assert tensor_digest(path)[0] == rec["files"][qtype]["tensors_sha256"], "not the file"
        _MODELS[(arch, qtype)] = load_model(path)
    return _MODELS[(arch, qtype)]


def run_chunks(
    runner: ModelRunner, seqs: list[list[int]], cuts: list[list[int]]
) -> list[torch.Tensor]:
    """Each sequence's logits [len, V], computed in the chunks ``cuts`` says (positions where a
    new step starts), the sequences' chunks of one round batched together."""
    bs = runner.bs
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    bounds = [[0, *c, len(s)] for s, c in zip(seqs, cuts, strict=True)]
    tables = []
    base = 0
    for s in seqs:
        n = -(-len(s) // bs)
        tables.append(list(range(base, base + n)))
        base += n
    runner.ensure_capacity(base)
    for step in range(max(len(b) - 1 for b in bounds)):
        items, who = [], []
        for j, (s, b) in enumerate(zip(seqs, bounds, strict=True)):
            if step < len(b) - 1:
                lo, hi = b[step], b[step + 1]
                items.append(BatchItem(s, lo, hi - lo, tables[j], True, {}, n_logits=hi - lo,
                                       slot=j, seq=100 + j))  # fmt: skip
                who.append((j, hi - lo))
        logits = runner.forward(items)
        row = 0
        for j, n in who:
            out[j].append(logits[row : row + n])
            row += n
    return [torch.cat(o) for o in out]
