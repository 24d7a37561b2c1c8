"""The catalogue tests' prompt, engine and oracle (transformers' or PEFT's greedy tokens), and
several clients using one catalogue entry for the first time at once."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import torch

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.model.loader import LoadedModel
from tests.engine_util import ask, follow, tokens
from tests.tiny import hf_logits

P = [1, 5, 77, 300, 12, 9, 260, 261, 200, 150, 33, 7, 41, 42, 43, 44, 45, 46]
N = 6


@functools.cache
def _greedy(m: torch.nn.Module, prompt: tuple[int, ...], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(hf_logits(m, ids)[-1].argmax()))
    return ids[len(prompt) :]


def greedy(m: torch.nn.Module, prompt: list[int], n: int = N) -> list[int]:
    """transformers' (or PEFT's) greedy tokens after ``prompt``."""
    return _greedy(m, tuple(prompt), n)


def engine(model: LoadedModel, root: Path, **kw) -> Engine:
    """An engine whose `--lora-dir` is ``root``."""
    return Engine(model, EngineConfig(n_ctx=512, block_size=4, lora_dirs=(str(root),), **kw))


def first_uses_at_once(eng: Engine, name: str, clients: int = 4) -> list[list[int]]:
    """On a started engine, ``clients`` threads released together each submit P under the
    catalogue entry ``name`` while a base request keeps decoding: each client's tokens."""
    base = eng.submit(**ask(P, 24))  # keeps decoding while the adapter is read
    go = threading.Barrier(clients)
    subs = []

    def client() -> None:
        go.wait()
        subs.append(eng.submit(**ask(P, N), adapter_name=name))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    answers = [tokens(follow(s.requests[0])) for s in subs]
    follow(base.requests[0])
    return answers
