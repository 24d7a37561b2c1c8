"""The C ABI of `layers.c`: ctypes structures laid out as its structs, and its signature."""

from __future__ import annotations

import ctypes

P, I64, I32, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float


class ProjC(ctypes.Structure):
    _fields_ = [("nparts", I32), ("types", ctypes.c_int * 8), ("ws", P * 8),
                ("ns", I64 * 8), ("row_bytes", I64 * 8), ("cols", I64 * 8), ("n_out", I64),
                ("bias", P)]  # fmt: skip


class MambaC(ctypes.Structure):
    _fields_ = [("taps", P), ("conv_b", P), ("ones", P), ("d", P), ("norm", P), ("dt_b", P),
                ("a", P), ("H", I64), ("P", I64), ("N", I64), ("G", I64), ("L", I64)]  # fmt: skip


class GdnC(ctypes.Structure):
    _fields_ = [("taps", P), ("ones", P), ("ones_s", P), ("norm", P), ("dt_b", P), ("a", P),
                ("ba_cols", P), ("eps", F), ("eps_qk", F), ("scale", F), ("Hk", I64),
                ("Hv", I64), ("S", I64), ("L", I64), ("interleave", I32),
                ("chunk", I64)]  # fmt: skip


class ConvC(ctypes.Structure):
    _fields_ = [("taps", P), ("C", I64), ("L", I64)]


class LayerC(ctypes.Structure):
    _fields_ = [("qkv", ProjC), ("o", ProjC), ("gate_up", ProjC), ("down", ProjC),
                ("attn_norm", P), ("qk_norm", P), ("post_attn_norm", P), ("ffn_norm", P),
                ("post_ffn_norm", P), ("sliding", I32), ("norm_n", I64 * 5), ("rope", I32),
                ("mamba", P), ("gdn", P), ("ffn_form", I32), ("no_mixer", I32),
                ("conv", P), ("beside", I32), ("ssm_in", ProjC), ("ssm_out", ProjC)]  # fmt: skip


PROJS = 6  # LoRA slots per layer (layers.h's LS_PROJS): qkv, o, gate_up, down, ssm_in, ssm_out


FFN_GATED, FFN_NONE, FFN_RELU_SQR = 0, 1, 2  # LayerC.ffn_form (layers.h's LS_FFN_*)


class ModelC(ctypes.Structure):
    _fields_ = [("n_layers", I64), ("hidden", I64), ("n_heads", I64), ("n_kv", I64),
                ("head_dim", I64), ("ffn", I64), ("eps", F), ("attn_scale", F), ("act", I32),
                ("layers", P), ("res_scale", F), ("vl", I32), ("rope_dim", I64),
                ("rope_pairs", I32), ("out_gate", I32)]  # fmt: skip


class LoraWC(ctypes.Structure):
    _fields_ = [("a", P), ("b", P), ("rank", I64), ("factor", F), ("bt", P), ("in_", I64),
                ("out", I64), ("a16", P), ("bt16", P), ("tail16", P)]  # fmt: skip


class LoraC(ctypes.Structure):
    _fields_ = [("n_active", I32), ("table", P), ("ad", P)]


class StepC(ctypes.Structure):
    _fields_ = [("slot_mapping", P), ("slots", P), ("seq_off", P), ("B", I64),
                ("row_seq", P), ("row_nkeys", P), ("window", I32), ("cos_g", P),
                ("sin_g", P), ("cos_l", P), ("sin_l", P), ("k_caches", P),
                ("v_caches", P), ("S", I64), ("lora", P), ("st_in", P),
                ("st_out", P)]  # fmt: skip


SIGNATURES = {
    "ls_decoder_layers": ([P, P, P, I64, ctypes.c_int], ctypes.c_int),
    "ls_sigmoid_gate": ([P, I64, P, I64, I64, I64, I64, I64, P], ctypes.c_int),
}
