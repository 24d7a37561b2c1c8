"""Checks and holds an adapter's LoRA pairs (`lora.adapter` reads them): each pair must fit
an adaptable base tensor and hold finite values, and is copied off the file's mapping into
what the kernels read (float16 pairs as their halves, `lora16.hold`; others as float32).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from loraserve.kernels import lora16
from loraserve.kernels.lora16 import tail, tiles
from loraserve.lora.read_gguf import Pairs, tensors_finite
from loraserve.lora.weight import LoraWeight

EMBED = "token_embd.weight"

Held = dict[str, tuple[LoraWeight, tuple[torch.Tensor, ...]]]
"""target -> (the weight held, the contiguous tensors its content id hashes: none for a
pair in the arena of float16 pairs, which is hashed whole)."""


class AdapterError(ValueError):
    """An adapter file that cannot be used with the loaded model; the message names why."""


def held_as_halves(a: torch.Tensor, halves: bool) -> bool:
    """Whether a pair is held as its file's halves alone (`lora16.hold` copies it)."""
    return halves and a.dim() == 2 and lora16.available()


def hold(
    path: Path, pairs: Pairs, base_shapes: dict[str, tuple[int, ...]], finite: bool
) -> tuple[Held, torch.Tensor | None]:
    """Every pair checked and held, in the file's order (`check`'s result for each), and
    the arena of the float16 pairs the kernels read: those are copied in one `lora16.hold`
    call, which also checks their values (``finite`` is about the other pairs only), into
    views of one arena, in target name order (so it does not depend on the file's order);
    their entries hash no tensor of their own (the arena's bytes are hashed once). The
    others are held one by one."""
    fast = sorted(t for t, (a, _, _, halves, _) in pairs.items() if held_as_halves(a, halves))
    held: Held = {}
    arena = None
    if fast:
        srcs = []
        for t in fast:
            a, b, factor, _, _ = pairs[t]
            fits(path, t, a, b, base_shapes)
            if not math.isfinite(factor):
                raise AdapterError(f"{path}: LoRA for {t!r} holds non-finite values")
            srcs.append((a.contiguous(), b.contiguous()))
        copies, ok, arena = lora16.hold(srcs)
        if not ok:  # name the first pair that holds one
            bad = next(t for t, (a, b) in zip(fast, srcs, strict=True)
                       if not (values_finite(a) and values_finite(b)))  # fmt: skip
            raise AdapterError(f"{path}: LoRA for {bad!r} holds non-finite values")
        for t, (a16, bt16, tail16) in zip(fast, copies, strict=True):
            held[t] = LoraWeight(None, None, pairs[t][2], a16, bt16, tail16), ()
    fast_set = set(fast)
    return {
        t: held[t] if t in fast_set else check(path, t, *pair, base_shapes, finite)
        for t, pair in pairs.items()
    }, arena


def fits(
    path: Path,
    target: str,
    a: torch.Tensor,
    b: torch.Tensor,
    base_shapes: dict[str, tuple[int, ...]],
) -> None:
    """`AdapterError` unless ``target`` is an adaptable base tensor that A [r, in] and B
    [out, r] (with the base's leading expert dimension, if any) fit."""
    if target == EMBED:
        raise AdapterError(f"{path}: a LoRA on {target!r} (token embeddings) is not supported")
    if target not in base_shapes:
        raise AdapterError(f"{path}: LoRA target {target!r} does not exist in the base model")
    base = base_shapes[target]
    lead, (out, inp) = base[:-2], base[-2:]
    ok = (
        a.dim() == b.dim() == len(base)
        and tuple(a.shape[:-2]) == tuple(b.shape[:-2]) == lead
        and a.shape[-1] == inp
        and b.shape[-2] == out
        and a.shape[-2] == b.shape[-1]
    )
    if not ok:
        raise AdapterError(
            f"{path}: LoRA for {target!r} has A {tuple(a.shape)} and B {tuple(b.shape)}, "
            f"which do not fit the base tensor {tuple(base)} (A [r, in], B [out, r])"
        )


def check(
    path: Path,
    target: str,
    a: torch.Tensor,
    b: torch.Tensor,
    factor: float,
    halves: bool,
    mapped: bool,
    base_shapes: dict[str, tuple[int, ...]],
    finite: bool = False,
) -> tuple[LoraWeight, tuple[torch.Tensor, torch.Tensor]]:
    """One pair checked against the base and held: (the weight, the contiguous tensors
    whose bytes its content id hashes: the halves of A and B [out, r], or float32 A and
    B). ``mapped``: the tensors may be views of a file mapping, copied before they are
    held; ``finite``: their values are known finite (else checked here)."""
    fits(path, target, a, b, base_shapes)
    if not (math.isfinite(factor) and (finite or (values_finite(a) and values_finite(b)))):
        raise AdapterError(f"{path}: LoRA for {target!r} holds non-finite values")
    a, b = a.contiguous(), b.contiguous()
    if halves and a.dim() == 2 and lora16.available():  # the file's own halves, held alone
        a16 = a.clone() if mapped else a  # the kernels read them (the same bits)
        return LoraWeight(None, None, factor, a16, tiles(b), tail(b)), (a16, b)
    wa, wb = a.float(), b.float()  # a copy of a float16 or BF16 tensor; float32 as it is:
    wa = wa.clone() if mapped and wa is a else wa  # then copied off the mapping
    wb = wb.clone() if mapped and wb is b else wb
    return LoraWeight(wa, wb, factor), (wa, wb)


def values_finite(t: torch.Tensor) -> bool:
    """Whether every value is finite: its min and max are (NaN propagates through both)."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def all_finite(pairs: Pairs) -> bool:
    """Whether every value of every pair is finite, one check per tensor type (one a
    tensor cost more than the copies); False sends `check` tensor by tensor, to name it."""
    return tensors_finite([t for a, b, *_ in pairs.values() for t in (a, b)])
