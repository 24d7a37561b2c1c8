"""Mixture-of-experts feed-forward as llama.cpp's llama MoE path.

Router softmax over experts, top-k, weights renormalised to sum 1, SiLU-gated experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.projection import Matrix, matmul
from loraserve.model.weights import WeightSource


class MoE(nn.Module):
    """Sparse expert FFN; experts stored stacked: gate/up [E, ffn, hidden], down [E, hidden, ffn].

    Each expert's rows run on the kernel of their stored type (`projection.matmul`). LoRA
    targets for experts are addressed by the stacked tensor names
    (``blk.N.ffn_gate_exps.weight``) with the expert index passed to the delta.
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
        self.gate = experts("ffn_gate_exps.weight")  # E x [ffn, hidden]
        self.up = experts("ffn_up_exps.weight")  # E x [ffn, hidden]
        self.down = experts("ffn_down_exps.weight")  # E x [hidden, ffn]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: [T, hidden] -> [T, hidden]."""
        cfg = self.cfg
        probs = torch.softmax(matmul(h, self.router), dim=-1)  # [T, E]
        weights, experts = torch.topk(probs, cfg.n_experts_used, dim=-1)  # [T, k]
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        lora = get_context().lora
        for e in torch.unique(experts).tolist():
            tok, slot = torch.nonzero(experts == e, as_tuple=True)  # tokens routed to e
            x = h.index_select(0, tok)  # [n, hidden]
            g = matmul(x, self.gate[e])
            u = matmul(x, self.up[e])
            if lora is not None:
                g = lora.apply_expert(self.prefix + "ffn_gate_exps.weight", e, x, g, tok)
                u = lora.apply_expert(self.prefix + "ffn_up_exps.weight", e, x, u, tok)
            a = F.silu(g) * u
            d = matmul(a, self.down[e])
            if lora is not None:
                d = lora.apply_expert(self.prefix + "ffn_down_exps.weight", e, a, d, tok)
            out.index_add_(0, tok, d * weights[tok, slot].unsqueeze(1))
        return out
