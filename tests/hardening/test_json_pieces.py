"""Large JSON answers are encoded in short pieces (`server/jsonout.py`) so that no single
C encoder call holds the GIL long, and the text is byte for byte what one `json.dumps` call
writes (the oracle here), non-finite floats aside (null, as llama-server)."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from loraserve.server import jsonout


def one_call(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def count_atoms(obj: Any) -> int:
    if isinstance(obj, dict):
        return 1 + sum(count_atoms(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return 1 + sum(count_atoms(v) for v in obj)
    return 1


rng = random.Random(5)
CASES = {
    "tokenize pieces": {"tokens": [{"id": i, "piece": chr(32 + i % 900)} for i in range(60_000)]},
    "embeddings": [[rng.random() for _ in range(700)] for _ in range(40)],
    "one wide row": {"data": [{"embedding": [rng.random() for _ in range(30_000)], "index": 0}]},
    "odd keys": {1: [2] * 9000, None: "x", 2.5: {"a\u2028é": [True, None] * 5000}},
    "empties": [[]] * 9000 + [{}] * 9000,
    "tuple": tuple(range(20_000)),
    "wide dict": {str(i): -1.5 for i in range(20_000)},
}


@pytest.mark.parametrize("name", CASES)
def test_pieces_write_what_one_call_writes(name: str) -> None:
    obj = CASES[name]
    assert jsonout.json_dumps(obj) == one_call(obj)


def test_non_finite_floats_become_null_in_every_piece() -> None:
    obj = {"p": [[0.5, math.nan]] * 5000, "q": [math.inf, -math.inf] * 5000}
    text = jsonout.json_dumps(obj)
    assert json.loads(text) == {"p": [[0.5, None]] * 5000, "q": [None, None] * 5000}


def test_no_encoder_call_takes_a_large_value_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real = json.dumps

    def spy(obj: Any, **kw: Any) -> str:
        sizes.append(count_atoms(obj))
        return real(obj, **kw)

    monkeypatch.setattr(jsonout.json, "dumps", spy)
    for obj in CASES.values():
        jsonout.json_dumps(obj)
    assert sizes and max(sizes) <= 2 * jsonout.ATOMS_PER_CALL
