"""The tensors of each recurrent layer and their exact shapes, checked before any layer is built
(`validate_tensors.check_tensors` calls `check`): the sizes themselves (`ModelConfig.ssm`), every
tensor a mixer reads (names with and without a ``.weight`` suffix, as llama.cpp writes
``ssm_a`` and ``ssm_d``), none missing, none of another shape. A crafted file fails here with
one line naming the tensor, never later inside a scan. Plain Python: no kernel is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Shape = tuple[int, ...]
MAX_SSM = 1 << 20  # any one SSM size (inner width, state, heads, kernel)

MAMBA2 = ("mamba2", "attn+mamba2")  # kinds running `Mamba2` (alone, or beside attention)


def sizes_problem(cfg: Any) -> str | None:
    """Why the config's SSM sizes cannot run, or None (every recurrent kind's)."""
    kinds = set(getattr(cfg, "layer_kinds", ()))
    if not kinds & {*MAMBA2, "mamba1"}:
        return None
    ssm = tuple(getattr(cfg, "ssm", ()))
    if len(ssm) != 5 or not all(isinstance(v, int) and 1 <= v <= MAX_SSM for v in ssm):
        what = "conv kernel, inner, state, heads or dt rank, groups"
        return f"SSM sizes {ssm} ({what}) must each be 1 to {MAX_SSM}"
    k, di, n, h, g = ssm
    if kinds & set(MAMBA2) and (di % h or h % g):
        return f"SSM inner size {di}, {h} heads and {g} groups do not divide evenly"
    return None


def layer_tensors(cfg: Any, i: int) -> dict[str, tuple[Shape, bool]]:
    """Layer ``i``'s recurrent tensors (names under ``blk.i.``) -> (torch-order shape, required)."""
    kinds = getattr(cfg, "layer_kinds", ())
    kind = kinds[i] if i < len(kinds) else "attn"
    hidden = cfg.hidden_size
    if kind in MAMBA2:
        k, di, n, h, g = cfg.ssm
        conv = di + 2 * g * n
        return {
            "ssm_in.weight": ((di + conv + h, hidden), True),
            "ssm_out.weight": ((hidden, di), True),
            "ssm_conv1d.weight": ((conv, k), True),
            "ssm_conv1d.bias": ((conv,), True),
            "ssm_dt.bias": ((h,), True),
            "ssm_a": ((h, 1), True),
            "ssm_d": ((h, 1), True),
            "ssm_norm.weight": ((g, di // g), False),
        }
    if kind == "mamba1":
        k, di, n, r, _ = cfg.ssm
        return {
            "ssm_in.weight": ((2 * di, hidden), True),
            "ssm_out.weight": ((hidden, di), True),
            "ssm_conv1d.weight": ((di, k), True),
            "ssm_conv1d.bias": ((di,), True),
            "ssm_x.weight": ((r + 2 * n, di), True),
            "ssm_dt.weight": ((di, r), True),
            "ssm_dt.bias": ((di,), True),
            "ssm_a": ((di, n), True),
            "ssm_d": ((di,), True),
            "ssm_dt_norm.weight": ((r,), False),
            "ssm_b_norm.weight": ((n,), False),
            "ssm_c_norm.weight": ((n,), False),
        }
    return {}


def ggml_shape(shape: Shape) -> tuple[int, ...]:
    """``shape`` as ggml stores it: outer dimensions of size 1 dropped (llama-quantize writes
    [1, N] as [N]: Granite 4's one-group ``ssm_norm``), which llama.cpp's loader accepts."""
    out = tuple(shape)
    while len(out) > 1 and out[0] == 1:
        out = out[1:]
    return out


def check(cfg: Any, shapes: Mapping[str, Shape]) -> str | None:
    """The first problem with the recurrent layers' tensors (``shapes``: name -> torch-order
    shape of the whole file), or None."""
    problem = sizes_problem(cfg)
    if problem is not None:
        return problem
    for i in range(cfg.n_layers):
        want = layer_tensors(cfg, i)
        for name, (shape, required) in want.items():
            got = shapes.get(f"blk.{i}.{name}")
            if got is None and required:
                return f"the model lacks tensor 'blk.{i}.{name}'"
            if got is not None and ggml_shape(got) != ggml_shape(shape):
                return (
                    f"tensor 'blk.{i}.{name}' has shape {tuple(got)}, expected {shape} "
                    f"(SSM sizes {tuple(cfg.ssm)}): the metadata does not describe these weights"
                )
        if "ssm_x.weight" in want:  # jamba's dt/B/C norms: all three or none
            norms = [f"blk.{i}.ssm_{n}_norm.weight" in shapes for n in ("dt", "b", "c")]
            if any(norms) and not all(norms):
                return f"layer {i} has some of ssm_dt_norm, ssm_b_norm, ssm_c_norm but not all"
    return None
