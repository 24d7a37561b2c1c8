"""Structure-aware mutations of GGUF files (and PEFT folders) for the file fuzzer
(`test_fuzz_files.py`): `fields` maps every header field of a file (counts, key and string
lengths, value and element types, scalar values, tensor dims, types and offsets) to its byte
range, and `mutate` changes one to three of them, or flips, inserts, deletes bytes or truncates
the file, always from a seeded generator so a case is named by (seed file, case number)."""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}  # fmt: skip


@dataclass(frozen=True)
class Field:
    """One header field: ``size`` bytes at ``offset``; ``role`` says what it is (``count``,
    ``strlen``, ``vtype``, ``arrtype``, ``arrcount``, ``int``, ``float``, ``ndims``, ``dim``,
    ``ttype``, ``toffset``); ``key`` the metadata key or tensor name it belongs to."""

    offset: int
    size: int
    role: str
    key: str = ""


def fields(data: bytes) -> tuple[list[Field], int]:
    """Every field of a well-formed GGUF file's header, and the header's end."""
    out: list[Field] = []
    pos = 8

    def u(fmt: str, role: str, key: str = "") -> int:
        nonlocal pos
        (v,) = struct.unpack_from("<" + fmt, data, pos)
        out.append(Field(pos, struct.calcsize(fmt), role, key))
        pos += struct.calcsize(fmt)
        return v

    def string(key: str) -> str:
        nonlocal pos
        n = u("Q", "strlen", key)
        s = data[pos : pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(t: int, key: str, in_array: bool) -> None:
        nonlocal pos
        if t == 8:
            string(key)
        elif t == 9:
            et = u("I", "arrtype", key)
            n = u("Q", "arrcount", key)
            if et in _SCALAR and et != 8:
                size = struct.calcsize(_SCALAR[et])
                if n <= 4:  # small arrays: each element a field
                    for _ in range(n):
                        value(et, key, True)
                else:
                    pos += n * size
            else:
                for _ in range(n):
                    value(et, key, True)
        else:
            fmt = _SCALAR[t]
            role = "float" if fmt in "fd" else "int"
            if in_array:
                pos += struct.calcsize(fmt)
            else:
                u(fmt, role, key)

    n_tensors = u("Q", "count")
    n_kv = u("Q", "count")
    for _ in range(n_kv):
        key = string("")
        t = u("I", "vtype", key)
        value(t, key, False)
    for _ in range(n_tensors):
        name = string("")
        nd = u("I", "ndims", name)
        for _ in range(nd):
            u("Q", "dim", name)
        u("I", "ttype", name)
        u("Q", "toffset", name)
    return out, pos


# the hyper-parameters the layers size their buffers from: mutated more often
_HOT_KEYS = ("block_count", "embedding_length", "feed_forward_length", "head_count",
             "head_count_kv", "key_length", "value_length", "context_length", "expert_count",
             "sliding_window", "alpha", "vocab_size")  # fmt: skip
_ROLES = ("hot", "int", "float", "count", "strlen", "vtype", "arrtype", "arrcount", "ndims",
          "dim", "ttype", "toffset")  # fmt: skip


def _int_candidates(v: int, size: int, rng: random.Random) -> list[int]:
    top = (1 << (8 * size)) - 1
    return [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 64, v - 1, v + 1, v * 2, v // 2, v + 32, v - 32,
            top, top >> 1, (top >> 1) + 1, 1 << 20, 1 << 31, rng.randrange(top + 1)]  # fmt: skip


def _set_field(buf: bytearray, f: Field, rng: random.Random) -> None:
    if f.role == "float":
        fmt = "<f" if f.size == 4 else "<d"
        v = rng.choice([0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e30, 1e-30, 1.5])
        struct.pack_into(fmt, buf, f.offset, v)
        return
    v = int.from_bytes(buf[f.offset : f.offset + f.size], "little")
    if f.role in ("vtype", "arrtype", "ttype"):
        new = rng.choice([rng.randrange(0, 42), rng.randrange(0, 1 << 32), 8, 9, 0, 1, 14, 30])
    elif f.role == "ndims":
        new = rng.choice([0, 1, 2, 3, 4, 5, 1 << 31])
    elif f.role == "toffset":
        new = rng.choice([0, v + 32, v - 32, v + 1, v * 2, 1 << 62, v + 4096])
    else:
        new = rng.choice(_int_candidates(v, f.size, rng))
    new &= (1 << (8 * f.size)) - 1
    buf[f.offset : f.offset + f.size] = new.to_bytes(f.size, "little")


def mutate(data: bytes, table: list[Field], header_end: int, rng: random.Random) -> bytes:
    """One mutated copy of ``data`` (a GGUF file whose header `fields` parsed)."""
    buf = bytearray(data)
    kind = rng.random()
    if kind < 0.08:  # truncation
        return bytes(buf[: rng.randrange(0, len(buf))])
    if kind < 0.16:  # random bytes in the header
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(header_end)] = rng.randrange(256)
        return bytes(buf)
    if kind < 0.20:  # bytes inserted into or deleted from the header
        at = rng.randrange(8, header_end)
        if rng.random() < 0.5:
            return bytes(
                buf[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 9))) + buf[at:]
            )
        return bytes(buf[:at] + buf[at + rng.randint(1, 9) :])
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        role = rng.choice(_ROLES)
        if role == "hot":
            pool = [f for f in table if f.role == "int" and f.key.endswith(_HOT_KEYS)]
        else:
            pool = [f for f in table if f.role == role]
        if pool:
            _set_field(buf, rng.choice(pool), rng)
    return bytes(buf)


# ---- PEFT adapter_config.json ------------------------------------------------------------

_EVIL_PATTERNS = ["(a+)+$", "(.*a){12}", "(a|a)*b", "((x*)*)*y", "(", "[", "(?P<n>a)(?P=n)",
                  ".*.*.*.*.*.*.*q", "a{1000000000}", "\\", "(?<=a+)b", ".*q_proj",
                  "model.layers.0.self_attn.q_proj", "(q|v)_proj"]  # fmt: skip
_ODD_VALUES = [0, -1, 1, 2, 10**9, 1.5, "8", None, [], {}, True, float("nan"), 1e308, "x"]


def mutate_peft_config(conf: dict, rng: random.Random) -> str:
    """A mutated adapter_config.json text: odd values for r / lora_alpha / use_rslora,
    rank and alpha patterns (catastrophic regexes among them), deep nesting, bad JSON."""
    c = json.loads(json.dumps(conf))
    kind = rng.random()
    if kind < 0.1:
        depth = rng.choice([50, 1000, 100000])
        return "[" * depth + "]" * depth
    if kind < 0.15:
        text = json.dumps(c)
        return text[: rng.randrange(len(text))]
    for _ in range(rng.randint(1, 3)):
        what = rng.choice(["r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern",
                           "target_modules", "peft_type", "fan_in_fan_out"])  # fmt: skip
        if what in ("rank_pattern", "alpha_pattern"):
            pats = {rng.choice(_EVIL_PATTERNS): rng.choice(_ODD_VALUES + [4, 8, 16])
                    for _ in range(rng.randint(1, 3))}  # fmt: skip
            c[what] = pats if rng.random() < 0.9 else rng.choice(_ODD_VALUES)
        else:
            c[what] = rng.choice(_ODD_VALUES)
    return json.dumps(c)
