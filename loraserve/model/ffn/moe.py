"""Routed experts, as llama.cpp's ``build_moe_ffn`` computes them, with optional shared experts.

Router logits -> probabilities (softmax or sigmoid, `ModelConfig.expert_gating`; or, for
"softmax_weight", the top-k logits softmaxed among themselves); the top-k by
probability plus an optional selection bias (``exp_probs_b``, which never enters the weights);
the chosen probabilities renormalised to sum 1 when the architecture asks (``expert_norm``) and
scaled by ``expert_scale`` (when not 0 or 1); llama4 (``expert_weight_input``) chooses by the
raw logits and multiplies each chosen expert's input, not its output, by the weight; gated
experts with the architecture's activation (SiLU, or gpt-oss's clamped swiglu_oai), with router
and expert biases where the file has them (gpt-oss: the bias of each projection after it).
Shared experts (``*_shexp``) run on every token and are added, gated by
``sigmoid(x . ffn_gate_inp_shexp)`` where that tensor exists (qwen2moe). nemotron_h_moe's
experts, routed and shared, have no gate stack (relu(up x)^2, then down), and its routed
experts may work in a latent space (``ffn_latent_down`` / ``ffn_latent_up`` around them).
"""

from __future__ import annotations

import torch
from torch import nn

from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.ffn.routed import RoutedExperts, ungated_act
from loraserve.model.layers import gated_act
from loraserve.model.projection import Matrix, Projection
from loraserve.model.weights import WeightSource


class MoE(nn.Module):
    """Sparse expert FFN; experts stored stacked: gate/up [E, ffn, hidden], down [E, hidden, ffn].

    The routed experts run in `routed.RoutedExperts` (quantized ones as one grouped C call
    per step). LoRA targets for experts are addressed by the stacked tensor names
    (``blk.N.ffn_gate_exps.weight``) with the expert index passed to the delta; the shared
    experts are ordinary projections (``blk.N.ffn_up_shexp.weight``...).
    """

    def __init__(self, cfg: ModelConfig, prefix: str, w: WeightSource) -> None:
        super().__init__()
        self.cfg, self.prefix = cfg, prefix
        router = w.matrix(prefix + "ffn_gate_inp.weight")
        if router is None:
            raise ValueError(f"model file lacks tensor {prefix + 'ffn_gate_inp.weight'!r}")
        # [E, hidden]; a projection, so adapters reach it (llama.cpp's build_moe_ffn applies
        # LoRA to the router logits: build_lora_mm(gate_inp, cur))
        self.router = Projection(prefix + "ffn_gate_inp.weight", [router])
        self.experts = RoutedExperts(cfg, prefix, w)
        # the stacks as adapters address them (`lora.registry.base_shapes`)
        self.fused = self.experts.fused
        self.gate, self.up, self.down = self.experts.gate, self.experts.up, self.experts.down
        self.select_bias = w.float(prefix + "exp_probs_b.bias")  # [E] or None
        self.router_bias = w.float(prefix + "ffn_gate_inp.bias")  # [E] or None (gpt-oss)
        # shared experts: submodules, so adapters find their parts as targets
        self.shared_gate_up: Projection | None = None
        self.shared_down: Projection | None = None
        # gated by ffn_gate_shexp; without it act(up) alone (nemotron_h_moe's relu^2)
        self.shared_gated = w.has(prefix + "ffn_gate_shexp.weight") or cfg.ffn_kind != "plain"
        if w.has(prefix + "ffn_up_shexp.weight"):
            stems = ("ffn_gate_shexp", "ffn_up_shexp") if self.shared_gated else ("ffn_up_shexp",)
            parts = [w.matrix(prefix + n + ".weight") for n in stems]
            down = w.matrix(prefix + "ffn_down_shexp.weight")
            if any(p is None for p in parts) or down is None:
                raise ValueError(f"model file lacks a shared expert tensor of {prefix!r}")
            gate_up = Projection(prefix + "ffn_gate_up_shexp.weight", parts)  # type: ignore[arg-type]
            self.shared_gate_up = gate_up
            self.shared_down = Projection(prefix + "ffn_down_shexp.weight", [down])
        # a latent space the routed experts work in (nemotron_h_moe: ffn_latent_down before
        # them, ffn_latent_up after; the router and shared experts read the layer's input)
        self.latent_down = _optional(w, prefix + "ffn_latent_down.weight")
        self.latent_up = _optional(w, prefix + "ffn_latent_up.weight")
        if (self.latent_down is None) != (self.latent_up is None):
            raise ValueError(f"{prefix!r}: ffn_latent_down and ffn_latent_up go together")
        gate = w.float(prefix + "ffn_gate_inp_shexp.weight")  # [hidden] or None
        name = prefix + "ffn_gate_inp_shexp.weight"
        self.shared_gate = (  # [1, hidden]: one fixed-order float row, an adapter target too
            None if gate is None
            else Projection(name, [Matrix.from_float(name, gate.reshape(1, -1))])
        )  # fmt: skip

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: [T, hidden] -> [T, hidden]."""
        cfg = self.cfg
        logits = self.router(h)  # [T, E]
        if self.router_bias is not None:
            logits = logits + self.router_bias
        if cfg.expert_gating == "sigmoid":
            probs = _sigmoid(logits)
        elif cfg.expert_gating == "softmax_weight":  # top-k logits, softmax over those
            probs = logits
        else:
            probs = logits.softmax(-1)
        select = probs if self.select_bias is None else probs + self.select_bias
        if cfg.expert_weight_input:  # llama4: chosen by the raw logits
            select = logits
        _, experts = torch.topk(select, cfg.n_experts_used, dim=-1)  # [T, k]
        weights = probs.gather(1, experts)  # [T, k]
        if cfg.expert_gating == "softmax_weight":
            weights = weights.softmax(-1)
        if cfg.expert_norm:
            weights = weights / weights.sum(-1, keepdim=True).clamp_min(6.103515625e-5)
        if cfg.expert_scale not in (0.0, 1.0):
            weights = weights * torch.tensor(cfg.expert_scale, dtype=torch.float32)
        x = h if self.latent_down is None else self.latent_down(h)  # the experts' input
        out = self.experts(x, experts, weights, get_context().lora)  # [T, hidden or latent]
        if self.latent_up is not None:
            out = self.latent_up(out)
        if self.shared_gate_up is not None and self.shared_down is not None:
            if self.shared_gated:
                gate, up = self.shared_gate_up(h).chunk(2, dim=-1)
                s = self.shared_down(gated_act(gate, up, "silu"))  # [T, hidden]
            else:
                s = self.shared_down(ungated_act(self.shared_gate_up(h), cfg.act))
            if self.shared_gate is not None:
                s = s * _sigmoid(self.shared_gate(h))  # [T, 1]
            out = out + s
        return out


def _optional(w: WeightSource, name: str) -> Projection | None:
    """The projection ``name`` where the file has it (an adapter target like the others)."""
    m = w.matrix(name) if w.has(name) else None
    return None if m is None else Projection(name, [m])


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """sigmoid of float32 x, computed in float64 and rounded: torch's float32 sigmoid takes a
    vectorised or a scalar path by where an element falls in the tensor, whose last bits differ,
    so a row's routing weights would depend on the batch; in float64 the two paths round to the
    same float32."""
    return torch.sigmoid(x.double()).float()
