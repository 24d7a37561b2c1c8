"""Row-wise operations in C (`rowops.c`), with torch fallbacks: RMSNorm, LayerNorm, rope, the
gated activation of the feed-forward, logit soft-capping, and the pass over a step's logits
(`scan_rows`)."""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from loraserve.cbuild import bind

_lib: ctypes.CDLL | None = None
_loaded = False


_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "ls_rms_norm": ([_P, _I, _I, _I, _I, _P, _I, _F, _P, ctypes.c_int], ctypes.c_int),
    "ls_norm_rope": ([_P, _I, _I, _I, _I, _P, _I, _F, _P, _P, _P, ctypes.c_int], ctypes.c_int),
    "ls_gated_act": ([_P, _P, _I, _I, _I, ctypes.c_int, _P, ctypes.c_int], ctypes.c_int),
    "ls_scan_rows": ([_P, _I, _I, _I, _P, _P, ctypes.c_int], ctypes.c_int),
    "ls_softcap": ([_P, _I, _I, _I, _F, ctypes.c_int], ctypes.c_int),
    "ls_layer_norm": ([_P, _I, _I, _I, _P, _P, _F, _P, ctypes.c_int], ctypes.c_int),
}


def _ok(rc: int, what: str) -> None:
    """A C entry point's refusal (-3: sizes that do not fit, issue 31) as an exception."""
    if rc != 0:
        raise ValueError(f"{what}: sizes that do not fit the C kernel ({rc})")


ACTS = {"silu": 0, "gelu_tanh": 1, "swiglu_oai": 2}  # the C kernel's activation codes
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0  # swiglu_oai's constants (llama.cpp hard-codes them too)


def _c() -> ctypes.CDLL | None:
    global _lib, _loaded
    if not _loaded:
        _lib, _loaded = bind(_SIGNATURES), True
    return _lib


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in float32: x [T, K] or [T, H, K] (rows of a token may be a
    view into a wider row, as q|k heads in a fused projection's output), weight [K] or
    [H, K] (float32, contiguous) -> a new contiguous float32 tensor of x's shape. Each row's
    result depends on that row alone."""
    lib = _c()
    # cheap checks only: this runs ~90 times a decode step
    k = x.shape[-1]
    if weight.shape[-1] != k or not (weight.dim() == 1 or (weight.dim() == 2 and x.dim() == 3)):
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} for rows of {k} values")
    if lib is not None and x.dtype == torch.float32 and x.stride(-1) == 1:
        if x.dim() == 2:
            y = torch.empty_like(x, memory_format=torch.contiguous_format)
            _ok(
                lib.ls_rms_norm(
                    x.data_ptr(),
                    x.shape[0],
                    1,
                    x.shape[1],
                    x.stride(0),
                    weight.data_ptr(),
                    1,
                    eps,
                    y.data_ptr(),
                    torch.get_num_threads(),
                ),
                "rms_norm",
            )
            return y
        if x.dim() == 3 and x.stride(1) == x.shape[2]:
            y = torch.empty_like(x, memory_format=torch.contiguous_format)
            hw = 1 if weight.dim() == 1 else weight.shape[0]
            _ok(
                lib.ls_rms_norm(
                    x.data_ptr(),
                    x.shape[0],
                    x.shape[1],
                    x.shape[2],
                    x.stride(0),
                    weight.data_ptr(),
                    hw,
                    eps,
                    y.data_ptr(),
                    torch.get_num_threads(),
                ),
                "rms_norm",
            )
            return y
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight
    return y.to(x.dtype) if x.dtype != torch.float32 else y


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dim in float32 (llama.cpp's LLM_NORM: mean and biased variance
    of the row, times weight, plus bias if any): x [T, K] (rows may be views into wider
    rows), weight/bias [K] float32 contiguous -> a new contiguous [T, K]. Each row's result
    depends on that row alone (C: one fixed summation order)."""
    lib = _c()
    if lib is not None and x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1:
        y = torch.empty(x.shape, dtype=torch.float32)
        bp = None if bias is None else bias.data_ptr()
        rc = lib.ls_layer_norm(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0),
                               weight.data_ptr(), bp, eps, y.data_ptr(),
                               torch.get_num_threads())  # fmt: skip
        _ok(rc, "layer_norm")
        return y
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps) * weight
    return y if bias is None else y + bias


def norm_rope(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Rotary embedding (halves rotated) after an optional per-head RMSNorm, in one call:
    x [T, H, D] float32 (token rows may be views into wider rows), weight [H, D] or [D] or
    None, cos/sin [T, D/2] contiguous -> a new contiguous [T, H, D]."""
    lib = _c()
    t, h, d = x.shape
    if cos.shape != (t, d // 2) or sin.shape != (t, d // 2) or d % 2:
        raise ValueError(f"norm_rope: tables {tuple(cos.shape)} for [{t}, {h}, {d}]")
    if weight is not None and weight.shape[-1] != d:
        raise ValueError(f"norm_rope: weight {tuple(weight.shape)} for heads of {d}")
    if weight is not None and weight.dim() == 2 and weight.shape[0] not in (1, h):
        raise ValueError(f"norm_rope: weight {tuple(weight.shape)} for {h} heads")
    if lib is None or x.dtype != torch.float32 or x.stride(2) != 1 or x.stride(1) != d:
        y = x.float() if weight is None else rms_norm(x, weight, eps)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        y1, y2 = y[..., : d // 2], y[..., d // 2 :]
        return torch.cat((y1 * c - y2 * s, y2 * c + y1 * s), dim=-1)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    hw = 0 if weight is None else (1 if weight.dim() == 1 else weight.shape[0])
    wp = None if weight is None else weight.data_ptr()
    rc = lib.ls_norm_rope(x.data_ptr(), t, h, d, x.stride(0), wp, max(hw, 1), eps,
                          cos.data_ptr(), sin.data_ptr(), y.data_ptr(),
                          torch.get_num_threads())  # fmt: skip
    _ok(rc, "norm_rope")
    return y


def gated_act(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up -> a new contiguous [T, F] float32: gate/up [T, F] (row views of one
    fused gate|up output are fine), act 'silu' (llama, qwen), 'gelu_tanh' (gemma) or
    'swiglu_oai' (gpt-oss: g = min(gate, 7), g * sigmoid(1.702 g) * (clamp(up, -7, 7) + 1),
    llama.cpp's ggml_swiglu_oai). The C kernel computes each value by one fixed formula (its
    own exp, the same in every lane), so a row's result never depends on the batch; the fused
    decoder calls the same code."""
    lib = _c()
    t, f = gate.shape
    if up.shape != gate.shape:
        raise ValueError(f"gated_act: gate {tuple(gate.shape)} and up {tuple(up.shape)}")
    if (
        lib is not None
        and gate.dtype == up.dtype == torch.float32
        and gate.stride(1) == up.stride(1) == 1
        and gate.stride(0) == up.stride(0)
    ):
        out = torch.empty(t, f)
        _ok(lib.ls_gated_act(gate.data_ptr(), up.data_ptr(), t, f, gate.stride(0), ACTS[act],
                         out.data_ptr(), torch.get_num_threads()), "gated_act")  # fmt: skip
        return out
    if act == "silu":
        return F.silu(gate) * up
    if act == "swiglu_oai":
        g = gate.clamp(max=OAI_LIMIT)
        return g * torch.sigmoid(OAI_ALPHA * g) * (up.clamp(-OAI_LIMIT, OAI_LIMIT) + 1.0)
    return F.gelu(gate, approximate="tanh") * up


def softcap_(x: torch.Tensor, cap: float) -> torch.Tensor:
    """x = cap * tanh(x / cap) in place (gemma2's final logits) for x [R, V] float32 -> x.
    The C kernel computes each value by one formula wherever it lies in its row; the
    fallback is elementwise torch."""
    lib = _c()
    if lib is not None and x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1:
        _ok(lib.ls_softcap(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), float(cap),
                       torch.get_num_threads()), "softcap")  # fmt: skip
        return x
    return x.copy_(torch.tanh(x * (1.0 / cap)) * cap)


def scan_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over logits x [R, V] (rows contiguous) -> (bad [R] bool: the row holds inf or
    NaN, top [R] int64: the first index of the row's maximum, as `torch.argmax`; for a bad
    row it is unspecified). Huge finite logits are not flagged."""
    rows, vocab = x.shape
    lib = _c()
    if lib is None or x.dtype != torch.float32 or x.device.type != "cpu" or x.stride(1) != 1:
        return ~torch.isfinite(x).all(dim=1), x.argmax(dim=1)
    bad = torch.empty(rows, dtype=torch.uint8)
    top = torch.empty(rows, dtype=torch.int64)
    _ok(lib.ls_scan_rows(x.data_ptr(), rows, vocab, x.stride(0), bad.data_ptr(), top.data_ptr(),
                     torch.get_num_threads()), "scan_rows")  # fmt: skip
    return bad.bool(), top
