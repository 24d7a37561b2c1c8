"""The routed experts of a MoE layer: their stacked weights and the three ways to run them.

- Quantized experts with the C kernels: `kernels.moe.GroupedExperts`, one call for the
  whole routed FFN of a step (tokens grouped by expert, one parallel region), or, when the
  step has adapters, its stages one by one with each expert's LoRA delta added between
  them (gate/up after the gate|up matmul, down after the down matmul, before the biases).
  Both give a row the same bits, so a request's numbers do not depend on whether another
  request of its batch had an adapter.
  A step whose adapters target no routed expert of the layer (attention-only adapters,
  say) keeps the one call: the staged path would give the same bits, more slowly.
- Float experts (the float32 precision, F16/BF16 files) or no C kernels: a loop over the
  experts of the step, each on `projection.matmul`, the outputs combined the same way.
- Experts without a gate stack (nemotron_h_moe: relu(up x)^2, then down) always run in
  stages, the activation in torch between the grouped matmuls (or in the loop).

Experts are repacked as `Matrix.pack` packs them (Q6_K, which Q4_K_M files keep for some
layers' ffn_down_exps, in pack_q6k.h's 8-row groups, the layout the grouped kernels read).

Every path sums a token's k expert outputs in its top-k slot order (llama.cpp's order).
"""

from __future__ import annotations

import torch

from loraserve.kernels.hugebuf import empty_u8
from loraserve.kernels.moe import GroupedExperts, Route
from loraserve.kernels.pack import pack_rows, packed_width
from loraserve.model.config import ModelConfig
from loraserve.model.context import LoraDelta
from loraserve.model.layers import gated_act
from loraserve.model.projection import Matrix, matmul
from loraserve.model.weights import WeightSource


class RoutedExperts:
    """Stacked experts ``{prefix}ffn_{gate,up,down}_exps`` (or a fused ``gate_up``) and
    biases; each expert's matrices repacked for the kernels where the type has a packed
    layout. ``gate``/``up`` [E] x [ffn, hidden], ``down`` [E] x [hidden, ffn]."""

    def __init__(self, cfg: ModelConfig, prefix: str, w: WeightSource) -> None:
        self.cfg, self.prefix = cfg, prefix
        self.fused = w.has(prefix + "ffn_gate_up_exps.weight")
        self.gated = True
        if self.fused:  # gate|up stored fused: split at load
            fused = _stack(w, prefix + "ffn_gate_up_exps.weight")  # E x [2 ffn, hidden]
            n = fused[0].shape[0] // 2
            self.gate = [m.rows(torch.arange(n)).pack() for m in fused]
            self.up = [m.rows(torch.arange(n, 2 * n)).pack() for m in fused]
            w.release(prefix + "ffn_gate_up_exps.weight")
        else:  # no gate stack: act(up) alone (nemotron_h_moe's relu^2)
            self.gated = w.has(prefix + "ffn_gate_exps.weight")
            self.gate = _packed(w, prefix + "ffn_gate_exps.weight") if self.gated else []
            self.up = _packed(w, prefix + "ffn_up_exps.weight")
        self.down = _packed(w, prefix + "ffn_down_exps.weight")
        # biases as the file has them; ungated experts take none (llama.cpp's graph passes none)
        self.gate_bias = w.float(prefix + "ffn_gate_exps.bias")  # [E, ffn] or None
        self.up_bias = w.float(prefix + "ffn_up_exps.bias") if self.gated else None  # [E, ffn]
        self.down_bias = w.float(prefix + "ffn_down_exps.bias") if self.gated else None
        self.grouped: GroupedExperts | None = None
        names = ("gate", "up", "down") if self.gated else ("up", "down")
        stacks = [getattr(self, n) for n in names]
        if GroupedExperts.supports([m[0].kernel_type for m in stacks]) and all(
            m.quantized for s in stacks for m in s
        ):
            self.grouped = GroupedExperts(
                [([m.data for m in s], s[0].kernel_type) for s in stacks[:-1]],
                ([m.data for m in self.down], self.down[0].kernel_type),
                cfg.act if self.gated else "silu", self.gate_bias, self.up_bias, self.down_bias,
                gated=self.gated,
            )  # fmt: skip
        # the stacked targets an adapter may have on these experts
        self._targets = [prefix + f"ffn_{n}_exps.weight" for n in ("gate", "up", "down", "gate_up")]

    def __call__(
        self, h: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
        lora: LoraDelta | None,
    ) -> torch.Tensor:  # fmt: skip
        """h [T, hidden], experts [T, k] long, weights [T, k] float32 -> [T, hidden]."""
        before = self.cfg.expert_weight_input  # llama4: the weight scales the expert's input
        g = self.grouped
        if g is None:
            return self._loop(h, experts, weights, lora, before)
        adapted = lora is not None and self._adapted(lora)
        if self.gated and not adapted:
            return g.ffn_rows(h, experts, weights, before)
        r = g.route(experts)
        scale = weights.reshape(-1)[r.pair].contiguous() if before else None  # [P]
        gu = g.gate_up(h, r, scale)  # [P, 2 ffn] ([P, ffn] ungated)
        spans = _spans(r)
        if lora is not None and adapted:
            for e, lo, hi in spans:
                x = _inputs(h, r.tok[lo:hi], None if scale is None else scale[lo:hi])
                self._lora_gate_up(lora, e, x, gu[lo:hi], r.tok[lo:hi])
        a = g.act_rows(gu, r) if self.gated else ungated_act(gu, self.cfg.act)  # [P, ffn]
        d = g.down(a, r)  # [P, hidden]
        target = self.prefix + "ffn_down_exps.weight"
        if lora is not None and adapted:
            for e, lo, hi in spans:
                _put(d[lo:hi], lora.apply_expert(target, e, a[lo:hi], d[lo:hi], r.tok[lo:hi]))
        return g.combine(d, r, None if before else weights)

    def _adapted(self, lora: LoraDelta) -> bool:
        """Whether an adapter of the step targets one of these expert stacks (True when the
        delta cannot say: the staged path is right either way)."""
        probe = getattr(lora, "targets", None)
        return probe is None or any(probe(n) for n in self._targets)

    def _lora_gate_up(
        self, lora: LoraDelta, e: int, x: torch.Tensor, gu: torch.Tensor, tok: torch.Tensor
    ) -> None:
        """Expert e's adapter deltas added in place to its rows gu [n, 2 ffn] (gate | up):
        on the stored ``ffn_gate_up_exps`` (gate rows first) where the file fuses them, else
        on ``ffn_gate_exps`` and ``ffn_up_exps``."""
        if self.fused or not self.gated:  # one stack: the fused gate|up, or up alone
            name = "ffn_gate_up_exps" if self.fused else "ffn_up_exps"
            _put(gu, lora.apply_expert(self.prefix + name + ".weight", e, x, gu, tok))
            return
        f = gu.shape[1] // 2
        for name, part in (("ffn_gate_exps", gu[:, :f]), ("ffn_up_exps", gu[:, f:])):
            _put(part, lora.apply_expert(self.prefix + name + ".weight", e, x, part, tok))

    def _loop(
        self, h: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
        lora: LoraDelta | None, before: bool,
    ) -> torch.Tensor:  # fmt: skip
        """One expert at a time (float weights, or no C kernels)."""
        t, k = experts.shape
        flat = experts.reshape(-1)  # [P] by pair id t * k + j
        d_all = torch.empty(t * k, h.shape[1])  # [P, hidden] by pair id
        for e in torch.unique(flat).tolist():
            pairs = torch.nonzero(flat == e).squeeze(1)  # the pairs routed to e, ascending
            tok = pairs // k
            x = _inputs(h, tok, weights.reshape(-1)[pairs] if before else None)  # [n, hidden]
            if not self.gated:  # act(up) alone
                gu = matmul(x, self.up[e])  # [n, ffn]
                if lora is not None:
                    self._lora_gate_up(lora, e, x, gu, tok)
                a = ungated_act(gu, self.cfg.act)
            else:
                gu = torch.cat((matmul(x, self.gate[e]), matmul(x, self.up[e])),
                               1)  # [n, 2 ffn]  # fmt: skip
                if lora is not None:
                    self._lora_gate_up(lora, e, x, gu, tok)
                f = gu.shape[1] // 2
                g, u = gu[:, :f], gu[:, f:]  # views of one row stride, as gated_act reads them
                if self.gate_bias is not None:
                    g += self.gate_bias[e]
                if self.up_bias is not None:
                    u += self.up_bias[e]
                a = gated_act(g, u, self.cfg.act)  # one C call: a row's bits are its own
            d = matmul(a, self.down[e])
            if lora is not None:
                d = lora.apply_expert(self.prefix + "ffn_down_exps.weight", e, a, d, tok)
            if self.down_bias is not None:
                d = d + self.down_bias[e]
            d_all[pairs] = d
        d_all = d_all.reshape(t, k, -1)
        if not before:
            d_all = d_all * weights.unsqueeze(2)
        out = d_all[:, 0].clone()
        for j in range(1, k):  # slot order: one add per value, the same bits anywhere
            out = out + d_all[:, j]
        return out


def ungated_act(u: torch.Tensor, act: str) -> torch.Tensor:
    """An ungated FFN's activation of u [n, ffn]: relu(u)^2 (nemotron-h), each value alone."""
    if act != "relu_sqr":
        raise ValueError(f"ungated experts with activation {act!r}")
    r = torch.relu(u)
    return r * r


def _stack(w: WeightSource, name: str) -> list[Matrix]:
    t = w.experts(name)
    if t is None:
        raise ValueError(f"model file lacks tensor {name!r}")
    return t


def _packed(w: WeightSource, name: str) -> list[Matrix]:
    """The stack's experts repacked where their type has a packed layout; the mapping's
    pages released once the copies serve."""
    mats = _stack(w, name)
    packed = _pack_stack(mats)
    if any(p is not m for p, m in zip(packed, mats, strict=True)):
        w.release(name)
    return packed


def _pack_stack(mats: list[Matrix]) -> list[Matrix]:
    """``[m.pack() for m in mats]``, the packed experts side by side in one buffer on huge
    pages (`kernels.hugebuf`: an expert of Qwen3-30B-A3B shapes is under 2 MiB, a stack
    of them is not, so only a stack can be backed by whole huge pages)."""
    m0 = mats[0]
    n, k = m0.shape
    width = packed_width(m0.ggml_type, k, n) if m0.quantized and not m0.packed else None
    if width is None or any(
        m.ggml_type != m0.ggml_type or m.shape != m0.shape or m.packed for m in mats
    ):
        return [m.pack() for m in mats]
    buf = empty_u8(len(mats) * n, width)  # [E N, width]
    out = []
    for e, m in enumerate(mats):
        data = pack_rows(m.data, m.ggml_type, k, buf[e * n : (e + 1) * n])
        if data is None:  # not packable after all: as Matrix.pack leaves them
            return [m.pack() for m in mats]
        out.append(Matrix(m.name, data, m.ggml_type, m.shape, True, m.data.shape[1]))
    return out


def _spans(r: Route) -> list[tuple[int, int, int]]:
    """(expert, first sorted row, end) of each expert with rows."""
    off = r.off.tolist()
    return [(e, off[e], off[e + 1]) for e in range(len(off) - 1) if off[e + 1] > off[e]]


def _inputs(h: torch.Tensor, tok: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """The rows of h [T, hidden] of tokens tok [n] (times scale [n]: llama4's input weight)."""
    x = h.index_select(0, tok)
    return x if scale is None else x * scale.unsqueeze(1)


def _put(dst: torch.Tensor, src: torch.Tensor) -> None:
    """An adapter's result into the rows it was given (deltas may come back as a new tensor)."""
    if src is not dst:
        dst.copy_(src)
