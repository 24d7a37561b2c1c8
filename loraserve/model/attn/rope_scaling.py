"""Rope frequency scaling as llama.cpp applies it: linear (positions interpolated by a factor),
YaRN (per-frequency blend of interpolation and extrapolation, with a magnitude scale on
cos/sin) and LongRoPE (phi3's per-frequency factors, short or long by the context size).

`read_scaling` reads a GGUF file's ``<arch>.rope.scaling.*`` keys as llama.cpp's
``load_hparams`` and ``llama_context`` constructor turn them into the rope's ``freq_scale``,
``ext_factor``, ``attn_factor``, ``beta_fast/slow`` and original context; `ScaledRope` builds
the cos/sin tables with them as ggml's ``rope_yarn`` does (``ggml-cpu/ops.cpp``):

    theta_extrap = pos * base^(-2i/n) / factor_i        theta_interp = freq_scale * theta_extrap
    ramp_i = (1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)) * ext_factor
    theta = theta_interp (1 - ramp_i) + theta_extrap ramp_i
    cos, sin = cos(theta) m, sin(theta) m,  m = attn_factor (1 + 0.1 ln(1 / freq_scale)) with YaRN

with ``lo``/``hi`` the correction dims of ``ggml_rope_yarn_corr_dims``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from loraserve.model.layers import Rope


@dataclass(frozen=True)
class RopeScaling:
    """A rope's frequency scaling (llama.cpp's cparams for ``ggml_rope_ext``)."""

    kind: str = "none"  # "none", "linear", "yarn" or "longrope"
    freq_scale: float = 1.0  # 1 / the scaling factor
    ext_factor: float = 0.0  # YaRN's blend (1 with YaRN, else 0)
    attn_factor: float = 1.0  # the magnitude factor handed to the rope
    ctx_orig: int = 0  # the trained context the correction dims are computed for
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @property
    def identity(self) -> bool:
        return self.freq_scale == 1.0 and self.ext_factor == 0.0 and self.attn_factor == 1.0

    def unscaled(self) -> RopeScaling:
        """The same with frequencies unscaled (llama.cpp's sliding layers' default
        ``rope_freq_scale_train_swa = 1``: only ext/attn factors stay)."""
        return replace(self, freq_scale=1.0)


def _f32(x: float) -> float:
    return float(np.float32(x))


def get_mscale(scale: float, mscale: float) -> float:
    """YaRN's magnitude ``0.1 mscale ln(scale) + 1`` (1 when scale <= 1), in float32."""
    if scale <= 1.0:
        return 1.0
    return _f32(_f32(0.1 * mscale) * _f32(math.log(scale)) + 1.0)


def read_scaling(keys: Any, ctx_train: int, yarn_log_mul: float = 0.0,
                 mscale_is_log_mul: bool = False) -> RopeScaling:  # fmt: skip
    """The rope scaling a GGUF file's keys describe (``keys``: `archs.Keys`), with
    llama.cpp's defaults; ``yarn_log_mul``: the architecture's ``rope_yarn_log_mul`` (deepseek2:
    its ``yarn_log_multiplier`` / 0.1); ``mscale_is_log_mul``: deepseek2's special case, whose
    mscale equals mscale_all_dims."""
    kind = str(keys.get("rope.scaling.type", "linear"))
    if kind not in ("none", "linear", "yarn", "longrope"):
        from loraserve.model.archs import UnsupportedModelError

        raise UnsupportedModelError(f"{keys.arch}: rope scaling type {kind!r} is not supported")
    factor = float(keys.get("rope.scaling.factor", 0.0) or keys.get("rope.scale_linear", 0.0) or 0)
    freq_scale = 1.0 if kind == "none" or factor == 0.0 else _f32(1.0 / factor)
    ctx_orig = int(keys.get("rope.scaling.original_context_length", 0) or 0) or ctx_train
    # llama.cpp's defaults: the files' yarn_ext_factor / yarn_attn_factor / beta keys are read
    # by grok (and the betas by mistral3) alone
    ext = 1.0 if kind == "yarn" else 0.0
    attn = 1.0
    if ext != 0.0:
        f = _f32(1.0 / freq_scale)
        if yarn_log_mul != 0.0:
            mscale = yarn_log_mul if mscale_is_log_mul and yarn_log_mul != 1.0 else 1.0
            attn = _f32(get_mscale(f, mscale) / get_mscale(f, yarn_log_mul))
        else:
            attn = get_mscale(f, 1.0)
        attn = _f32(attn * _f32(1.0 / _f32(1.0 + _f32(0.1 * _f32(math.log(f))))))
    attn = _f32(attn * float(keys.get("rope.scaling.attn_factor", 1.0)))
    return RopeScaling(
        kind=kind,
        freq_scale=freq_scale,
        ext_factor=ext,
        attn_factor=attn,
        ctx_orig=ctx_orig,
    )


def corr_dims(
    n_dims: int, ctx_orig: int, base: float, fast: float, slow: float
) -> tuple[float, float]:
    """``ggml_rope_yarn_corr_dims``: the pair indices where YaRN's ramp starts and ends."""

    def dim(n_rot: float) -> float:
        return n_dims * math.log(ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(dim(fast))), min(n_dims - 1.0, math.ceil(dim(slow)))


class ScaledRope(Rope):
    """`Rope` with llama.cpp's frequency scaling (`RopeScaling`): same tables interface."""

    def __init__(self, head_dim: int, theta: float, max_pos: int,
                 factors: torch.Tensor | None, scaling: RopeScaling) -> None:  # fmt: skip
        object.__setattr__(self, "scaling", scaling)
        object.__setattr__(self, "base", theta)
        super().__init__(head_dim, theta, max_pos, factors)

    def _grow(self, n: int) -> None:
        s: RopeScaling = self.scaling  # type: ignore[has-type]
        t = torch.arange(n, dtype=torch.float32)
        extrap = torch.outer(t, self.inv_freq)  # [n, D/2]
        theta = extrap * s.freq_scale
        mscale = s.attn_factor
        if s.ext_factor != 0.0:
            lo, hi = corr_dims(self.head_dim, s.ctx_orig, self.base, s.beta_fast, s.beta_slow)
            i = torch.arange(self.head_dim // 2, dtype=torch.float32)
            y = (i - lo) / max(0.001, hi - lo)
            ramp = (1 - y.clamp(0.0, 1.0)) * s.ext_factor  # [D/2]
            theta = theta * (1 - ramp) + extrap * ramp
            mscale = _f32(mscale * _f32(1.0 + _f32(0.1 * math.log(1.0 / s.freq_scale))))
        self._cos, self._sin = theta.cos() * mscale, theta.sin() * mscale
