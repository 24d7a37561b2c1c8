"""Deterministic workload generators for the benchmark.

Everything here is a pure function of its arguments and a seed: prompts of an exact token
length, LoRA adapter files, Zipf popularity, Poisson arrivals and multi-turn chat sessions.
The same seed gives the same workload for loraserve and for llama-server.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

Encode = Callable[[str], list[int]]
Mix = tuple[tuple[int, float], ...]

WORDS = (
    "the river city market morning light window garden quiet story letter music "
    "teacher winter summer bridge mountain forest train station coffee paper road "
    "friend evening harbor island village orchard painter library lantern meadow "
    "kitchen journey stone silver candle thunder whisper valley festival engine "
    "clock mirror ladder compass sailor baker doctor farmer artist student traveler"
).split()
TOPICS = (
    "Tell me about", "Describe", "Write two sentences about", "Explain simply",
    "Give a short fact about", "What do you know about",
)  # fmt: skip
GEMMA_USER = "<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"
GEMMA_NEXT = "<end_of_turn>\n"
B_SCALE = 0.125  # lora_b std * sqrt(rank): visible but sane changes to Gemma 3 270M at scale 1


def sentence(rng: random.Random, n_words: int = 12) -> str:
    """A plain English-looking sentence of `n_words` words."""
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize() + "."


def prompt_tokens(
    encode: Encode, n_tokens: int, seed: int, prefix: Sequence[int] = ()
) -> list[int]:
    """Exactly `n_tokens` token ids: `prefix` followed by encoded sentences, cut to length.

    `encode` turns text into ids without adding BOS (the caller puts BOS in `prefix`).
    """
    rng = random.Random(seed)
    ids = list(prefix)
    while len(ids) < n_tokens:
        ids += encode(" " + sentence(rng))
    return ids[:n_tokens]


@dataclass(frozen=True)
class AdapterShapes:
    """Which projections a LoRA adapter targets, as (tensor name, in features, out features)
    per layer. The default is Gemma 3 270M."""

    n_layers: int = 18
    hidden: int = 640
    q_out: int = 1024
    kv_out: int = 256
    ffn: int = 2048

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, in, out) for the seven projections of one layer."""
        h = self.hidden
        return [
            ("attn_q", h, self.q_out),
            ("attn_k", h, self.kv_out),
            ("attn_v", h, self.kv_out),
            ("attn_output", self.q_out, h),
            ("ffn_gate", h, self.ffn),
            ("ffn_up", h, self.ffn),
            ("ffn_down", self.ffn, h),
        ]


def adapter_tensors(
    seed: int, shapes: AdapterShapes, rank: int = 8, strength: float = 1.0
) -> dict[str, np.ndarray]:
    """Random float16 LoRA tensors: `lora_a` [rank, in] and `lora_b` [out, rank] per
    projection: A ~ N(0, 1/in), B ~ N(0, (strength * B_SCALE)^2 / rank), so that at scale 1
    (alpha = rank) greedy text changes visibly but stays sane."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for layer in range(shapes.n_layers):
        for name, n_in, n_out in shapes.projections():
            base = f"blk.{layer}.{name}.weight"
            a = rng.standard_normal((rank, n_in)) / math.sqrt(n_in)
            b = rng.standard_normal((n_out, rank)) * (strength * B_SCALE / math.sqrt(rank))
            out[f"{base}.lora_a"] = a.astype(np.float16)
            out[f"{base}.lora_b"] = b.astype(np.float16)
    return out


def write_adapters(
    folder: Path,
    n: int,
    *,
    rank: int = 8,
    seed: int = 0,
    shapes: AdapterShapes | None = None,
    strength: float = 1.0,
) -> list[Path]:
    """Write `n` GGUF LoRA adapters `bench_lora_XX.gguf` into `folder` (reusing files already
    there with the same name); adapter `i` is seeded with `seed + i`."""
    from loraserve.model.gguf_write import write_gguf

    shapes = shapes or AdapterShapes()
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"v1-r{rank}-s{seed}-L{shapes.n_layers}-h{shapes.hidden}-x{strength:g}"
    paths = []
    for i in range(n):
        path = folder / f"bench_lora_{tag}_{i:02d}.gguf"
        if not path.is_file():
            meta = {
                "general.architecture": "gemma3",
                "general.type": "adapter",
                "general.name": f"bench_lora_{i:02d}",
                "adapter.type": "lora",
                "adapter.lora.alpha": float(rank),
            }
            write_gguf(path, meta, adapter_tensors(seed + i, shapes, rank, strength))
        paths.append(path)
    return paths


def mix_lora(mix: Mix, n_adapters: int) -> list[dict[str, float]]:
    """The request `lora` field for `mix`: every loaded id with its scale (unlisted ids 0)."""
    scales = dict(mix)
    return [{"id": i, "scale": float(scales.get(i, 0.0))} for i in range(n_adapters)]


def distinct_mixes(n: int, n_adapters: int) -> list[Mix]:
    """`n` different single-adapter mixes (adapter i at scale 1), cycling over the adapters."""
    if n > n_adapters:
        raise ValueError(f"{n} distinct single-adapter mixes need {n} adapters, have {n_adapters}")
    return [((i, 1.0),) for i in range(n)]


def zipf_weights(n: int, s: float = 1.1) -> list[float]:
    """Zipf popularity of `n` items: weight of rank k (1-based) proportional to 1 / k^s."""
    raw = [1.0 / (k**s) for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def zipf_choices(n_items: int, n_draws: int, seed: int, s: float = 1.1) -> list[int]:
    """`n_draws` item indices drawn with Zipf popularity (index 0 the most popular)."""
    rng = random.Random(seed)
    return rng.choices(range(n_items), weights=zipf_weights(n_items, s), k=n_draws)


def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    """Arrival times in seconds (starting after 0) of `n` requests at `rate` per second."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


@dataclass
class ChatTurn:
    """One user turn: `suffix` is the new text after the session's history so far. With an
    `alt_mix`, the user then regenerates the same answer under that mix ("try it with
    another adapter"); the conversation goes on from the first answer."""

    user: int
    turn: int
    mix: Mix
    suffix: list[int]
    alt_mix: Mix | None = None


@dataclass
class ChatSession:
    """One user's conversation: its mix and the tokens sent so far (history)."""

    user: int
    mix: Mix
    history: list[int] = field(default_factory=list)


def chat_workload(
    encode: Encode,
    *,
    n_users: int,
    n_turns: int,
    system_tokens: int,
    mixes: Sequence[Mix],
    seed: int,
    bos: Sequence[int] = (),
    regenerate: bool = False,
) -> tuple[list[ChatSession], list[ChatTurn]]:
    """Users pinned to `mixes[user % len(mixes)]`, all sharing one system prompt of
    `system_tokens` tokens; turns interleaved round-robin (user 0 turn 0, user 1 turn 0, ...).
    With `regenerate`, every turn is regenerated under the next user's mix.

    Each session's history starts as the system prompt; a turn's prompt is its history plus
    `suffix` (the Gemma chat markup around a new user message). The runner appends the
    server's answer and `GEMMA_NEXT` to the history after each turn.
    """
    rng = random.Random(seed)
    system = prompt_tokens(encode, system_tokens, seed, prefix=bos)
    sessions = [ChatSession(u, mixes[u % len(mixes)], list(system)) for u in range(n_users)]
    turns = []
    for t in range(n_turns):
        for u in range(n_users):
            text = f"{rng.choice(TOPICS)} the {rng.choice(WORDS)} and the {rng.choice(WORDS)}."
            alt = mixes[(u + 1) % len(mixes)] if regenerate else None
            suffix = encode(GEMMA_USER.format(text=text))
            turns.append(ChatTurn(u, t, sessions[u].mix, suffix, alt))
    return sessions, turns


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q` percentile (0-100, linear interpolation) of `values`, None when empty."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))
