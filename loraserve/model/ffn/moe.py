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
``sigmoid(x . ffn_gate_inp_shexp)`` where that tensor exists (qwen2moe).
"""

from __future__ import annotations

import torch
from torch import nn

from loraserve.model.config import ModelConfig
from loraserve.model.context import LoraDelta, get_context
from loraserve.model.layers import gated_act
from loraserve.model.projection import Matrix, Projection, matmul
from loraserve.model.weights import WeightSource


class MoE(nn.Module):
    """Sparse expert FFN; experts stored stacked: gate/up [E, ffn, hidden], down [E, hidden, ffn].

    Each expert's rows run on the kernel of their stored type (`projection.matmul`). LoRA
    targets for experts are addressed by the stacked tensor names
    (``blk.N.ffn_gate_exps.weight``) with the expert index passed to the delta; the shared
    experts are ordinary projections (``blk.N.ffn_up_shexp.weight``...).
    """

    def __init__(self, cfg: ModelConfig, prefix: str, w: WeightSource) -> None:
        super().__init__()
        self.cfg, self.prefix = cfg, prefix

        def experts(n: str) -> list[Matrix]:
            t = w.experts(prefix + n)
            if t is None:
                raise ValueError(f"model file lacks tensor {prefix + n!r}")
            return t

        router = w.matrix(prefix + "ffn_gate_inp.weight")
        if router is None:
            raise ValueError(f"model file lacks tensor {prefix + 'ffn_gate_inp.weight'!r}")
        self.router = router  # [E, hidden]
        self.fused = w.has(prefix + "ffn_gate_up_exps.weight")
        if self.fused:  # gate|up stored fused: split at load
            fused = experts("ffn_gate_up_exps.weight")  # E x [2 ffn, hidden], gate first
            n = fused[0].shape[0] // 2
            self.gate = [m.rows(torch.arange(n)).pack() for m in fused]
            self.up = [m.rows(torch.arange(n, 2 * n)).pack() for m in fused]
        else:
            self.gate = experts("ffn_gate_exps.weight")  # E x [ffn, hidden]
            self.up = experts("ffn_up_exps.weight")  # E x [ffn, hidden]
        self.down = experts("ffn_down_exps.weight")  # E x [hidden, ffn]
        self.select_bias = w.float(prefix + "exp_probs_b.bias")  # [E] or None
        self.router_bias = w.float(prefix + "ffn_gate_inp.bias")  # [E] or None (gpt-oss)
        self.gate_bias = w.float(prefix + "ffn_gate_exps.bias")  # [E, ffn] or None
        self.up_bias = w.float(prefix + "ffn_up_exps.bias")  # [E, ffn] or None
        self.down_bias = w.float(prefix + "ffn_down_exps.bias")  # [E, hidden] or None
        # shared experts: submodules, so adapters find their parts as targets
        self.shared_gate_up: Projection | None = None
        self.shared_down: Projection | None = None
        if w.has(prefix + "ffn_up_shexp.weight"):
            parts = [w.matrix(prefix + n + ".weight") for n in ("ffn_gate_shexp", "ffn_up_shexp")]
            down = w.matrix(prefix + "ffn_down_shexp.weight")
            if any(p is None for p in parts) or down is None:
                raise ValueError(f"model file lacks a shared expert tensor of {prefix!r}")
            gate_up = Projection(prefix + "ffn_gate_up_shexp.weight", parts)  # type: ignore[arg-type]
            self.shared_gate_up = gate_up
            self.shared_down = Projection(prefix + "ffn_down_shexp.weight", [down])
        gate = w.float(prefix + "ffn_gate_inp_shexp.weight")  # [hidden] or None
        self.shared_gate = (  # [1, hidden]: one fixed-order float row
            None if gate is None else Matrix.from_float(prefix + "ffn_gate_inp_shexp.weight",
                                                        gate.reshape(1, -1))
        )  # fmt: skip

    def _lora_gate_up(
        self, lora: LoraDelta, e: int, x: torch.Tensor, g: torch.Tensor, u: torch.Tensor,
        tok: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Expert e's gate and up outputs g, u [n, ffn] with their adapters' deltas: on the
        stored ``ffn_gate_up_exps`` (gate rows first) where the file fuses them, else on
        ``ffn_gate_exps`` and ``ffn_up_exps``."""
        if self.fused:
            gu = lora.apply_expert(self.prefix + "ffn_gate_up_exps.weight", e, x,
                                   torch.cat((g, u), 1), tok)  # fmt: skip
            return gu[:, : g.shape[1]], gu[:, g.shape[1] :]
        g = lora.apply_expert(self.prefix + "ffn_gate_exps.weight", e, x, g, tok)
        return g, lora.apply_expert(self.prefix + "ffn_up_exps.weight", e, x, u, tok)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: [T, hidden] -> [T, hidden]."""
        cfg = self.cfg
        logits = matmul(h, self.router)  # [T, E]
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
        out = torch.zeros_like(h)
        lora = get_context().lora
        before = cfg.expert_weight_input  # llama4: the weight scales the expert's input
        for e in torch.unique(experts).tolist():
            tok, slot = torch.nonzero(experts == e, as_tuple=True)  # tokens routed to e
            x = h.index_select(0, tok)  # [n, hidden]
            if before:
                x = x * weights[tok, slot].unsqueeze(1)
            g = matmul(x, self.gate[e])
            u = matmul(x, self.up[e])
            if lora is not None:
                g, u = self._lora_gate_up(lora, e, x, g, u, tok)
            if self.gate_bias is not None:
                g = g + self.gate_bias[e]
            if self.up_bias is not None:
                u = u + self.up_bias[e]
            a = gated_act(g, u, cfg.act)  # one C call: a row's bits are its own
            d = matmul(a, self.down[e])
            if lora is not None:
                d = lora.apply_expert(self.prefix + "ffn_down_exps.weight", e, a, d, tok)
            if self.down_bias is not None:
                d = d + self.down_bias[e]
            out.index_add_(0, tok, d if before else d * weights[tok, slot].unsqueeze(1))
        if self.shared_gate_up is not None and self.shared_down is not None:
            gate, up = self.shared_gate_up(h).chunk(2, dim=-1)
            s = self.shared_down(gated_act(gate, up, "silu"))  # [T, hidden]
            if self.shared_gate is not None:
                s = s * _sigmoid(matmul(h, self.shared_gate))  # [T, 1]
            out = out + s
        return out


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """sigmoid of float32 x, computed in float64 and rounded: torch's float32 sigmoid takes a
    vectorised or a scalar path by where an element falls in the tensor, whose last bits differ,
    so a row's routing weights would depend on the batch; in float64 the two paths round to the
    same float32."""
    return torch.sigmoid(x.double()).float()
