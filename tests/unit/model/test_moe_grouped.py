"""Grouped expert matmuls (`kernels/moe.py`, `model/ffn/routed.py`).

Oracles: each (token, slot) pair run alone through the single-matrix kernels (`qmatmul`,
itself checked against gguf-py and llama.cpp), bitwise; gguf-py's float64 dequantization
within the activation quantization's error. And the engine's promise: a token's output is
bitwise the same alone, in any batch, in the one-call path and the staged path that steps
with adapters take, and, with adapters, equal to the per-expert loop with the same deltas.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import loraserve.kernels as K
from loraserve.kernels.moe import GroupedExperts
from loraserve.kernels.pack_q6k import pack_q6k
from loraserve.kernels.rowops import gated_act
from loraserve.model.dequant import GGML_TYPE
from loraserve.model.ffn.routed import RoutedExperts
from loraserve.model.projection import Matrix
from tests.unit.model.moe_util import ExpertLora, ExpertWeights
from tests.unit.model.quant_util import dequantized, random_rows

pytestmark = pytest.mark.skipif(K.backend() != "c", reason="grouped experts need the C kernels")

E, TOP, H, FF = 5, 2, 256, 256
# (gate/up type, down type, packed)
TYPES = [("Q4_K", "Q6_K", True), ("Q4_K", "Q4_K", False), ("Q5_0", "Q8_0", True),
         ("Q8_0", "Q5_0", False), ("Q4_0", "IQ4_NL", True), ("MXFP4", "Q4_0", False)]  # fmt: skip


def stack(rng: np.random.Generator, name: str, n: int, k: int, pack: bool) -> tuple:
    """E random matrices [n, k] of type ``name``: (kernel rows per expert, kernel type, raw
    file rows per expert)."""
    raws = [torch.from_numpy(random_rows(rng, name, n, k)) for _ in range(E)]
    t = GGML_TYPE[name]
    if pack and name == "Q6_K":  # the experts' own packed layout (kernels/pack_q6k.h)
        return [pack_q6k(r, k) for r in raws], t | K.PACKED, raws
    if pack and K.pack_rows(raws[0], t, k) is not None:
        return [K.pack_rows(r, t, k) for r in raws], t | K.PACKED, raws
    return raws, t, raws


def routing(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    experts = torch.stack([torch.randperm(E, generator=g)[:TOP] for _ in range(t)])  # [T, k]
    return experts, torch.rand(t, TOP, generator=g)  # weights [T, k]


def pair_alone(x, stacks, e, w, act, biases, before):  # type: ignore[no-untyped-def]
    """One pair through the single-matrix kernels: x [1, H] -> [1, H] (weighted). Packed
    Q6_K (only the grouped kernels read it) as the file's rows: the same bits by design."""
    q6 = K.PACKED | GGML_TYPE["Q6_K"]
    (gate, tg), (up, tu), (down, td) = ((s[2], s[1] & ~K.PACKED) if s[1] == q6 else s[:2]
                                        for s in stacks)  # fmt: skip
    gb, ub, db = biases
    if before:
        x = x * w
    g = K.qmatmul(K.quantize_rows(x, K.activation_block(tg)), gate[e], tg)
    u = K.qmatmul(K.quantize_rows(x, K.activation_block(tu)), up[e], tu)
    if gb is not None:
        g, u = g + gb[e], u + ub[e]
    a = gated_act(g, u, act)
    d = K.qmatmul(K.quantize_rows(a, K.activation_block(td)), down[e], td)
    if db is not None:
        d = d + db[e]
    return d if before else d * w


def variant_parts(variant: str, g: torch.Generator) -> tuple[str, tuple, bool]:
    """A case's activation, its expert biases (gate, up, down: drawn from ``g`` for a "+bias"
    variant, else None) and whether the routing weights scale the input ("before")."""
    act = "swiglu_oai" if "oai" in variant else "silu"
    biases: tuple = (None, None, None)
    if "bias" in variant:
        biases = tuple(torch.randn(E, n, generator=g) * 0.1 for n in (FF, FF, H))
    return act, biases, variant == "before"


# every type pair with SiLU; gpt-oss's biases and clamped SwiGLU, llama4's input weights on two
CASES = [(t, "silu") for t in TYPES] + [
    (t, v) for t in (TYPES[0], TYPES[2]) for v in ("swiglu_oai+bias", "before")
]


def _case_id(c: object) -> str:
    return "-".join(map(str, c)) if isinstance(c, tuple) else str(c)


@pytest.mark.parametrize(("types", "variant"), CASES, ids=_case_id)
def test_grouped_equals_each_pair_alone_bitwise(types: tuple, variant: str) -> None:
    rng = np.random.default_rng(7)
    tgu, tdown, pack = types
    gate, up = stack(rng, tgu, FF, H, pack), stack(rng, tgu, FF, H, pack)
    down = stack(rng, tdown, H, FF, pack)
    g = torch.Generator().manual_seed(1)
    act, biases, before = variant_parts(variant, g)
    ge = GroupedExperts([gate[:2], up[:2]], down[:2], act, *biases)
    x = torch.randn(40, H, generator=g)  # 40 tokens: ~16 rows an expert (the many-row tiles)
    experts, w = routing(40, 2)
    got = ge.ffn_rows(x, experts, w, before)
    stacks = [gate, up, down]
    for t in range(40):
        parts = [pair_alone(x[t : t + 1], stacks, int(experts[t, j]), w[t, j], act, biases,
                            before) for j in range(TOP)]  # fmt: skip
        want = parts[0]
        for p in parts[1:]:  # the top-k slot order
            want = want + p
        assert torch.equal(got[t : t + 1], want), f"token {t}"
    # the same rows alone and in other batches; the staged path: the same bits
    alone = torch.cat([ge.ffn_rows(x[t : t + 1], experts[t : t + 1], w[t : t + 1], before)
                       for t in range(40)])  # fmt: skip
    assert torch.equal(alone, got)
    assert torch.equal(ge.ffn_rows(x[5:12], experts[5:12], w[5:12], before), got[5:12])
    r = ge.route(experts)
    scale = w.reshape(-1)[r.pair].contiguous() if before else None
    d = ge.down(ge.act_rows(ge.gate_up(x, r, scale), r), r)
    assert torch.equal(ge.combine(d, r, None if before else w), got)


@pytest.mark.parametrize("variant", ["silu", "swiglu_oai+bias", "before"])
def test_many_rows_run_in_expert_groups_bitwise(variant: str) -> None:
    """A prompt whose rows outgrow one group of experts (moe.c's GROUP_BYTES: 2048 rows of
    this F) runs group by group, each token's slots summed as their groups end, some rows
    waiting for an earlier slot of a later group: every token as its pairs alone give it,
    and as the staged path's whole-prompt buffers and combine give it."""
    rng = np.random.default_rng(11)
    gate, up = stack(rng, "Q4_K", FF, H, True), stack(rng, "Q4_K", FF, H, True)
    down = stack(rng, "Q6_K", H, FF, True)
    g = torch.Generator().manual_seed(3)
    act, biases, before = variant_parts(variant, g)
    ge = GroupedExperts([gate[:2], up[:2]], down[:2], act, *biases)
    t = 1500  # 3000 rows: two or three groups
    x = torch.randn(t, H, generator=g)
    experts, w = routing(t, 4)
    got = ge.ffn_rows(x, experts, w, before)
    r = ge.route(experts)
    scale = w.reshape(-1)[r.pair].contiguous() if before else None
    d = ge.down(ge.act_rows(ge.gate_up(x, r, scale), r), r)
    assert torch.equal(ge.combine(d, r, None if before else w), got)
    for i in range(0, t, 97):
        parts = [pair_alone(x[i : i + 1], [gate, up, down], int(experts[i, j]), w[i, j], act,
                            biases, before) for j in range(TOP)]  # fmt: skip
        want = parts[0]
        for p in parts[1:]:
            want = want + p
        assert torch.equal(got[i : i + 1], want), f"token {i}"


@pytest.mark.parametrize("types", TYPES[:3], ids=lambda t: "-".join(map(str, t)))
def test_grouped_equals_float64_dequantized_reference(types: tuple) -> None:
    rng = np.random.default_rng(11)
    tgu, tdown, pack = types
    gate, up = stack(rng, tgu, FF, H, pack), stack(rng, tgu, FF, H, pack)
    down = stack(rng, tdown, H, FF, pack)
    ge = GroupedExperts([gate[:2], up[:2]], down[:2], "silu")
    x = torch.randn(9, H, generator=torch.Generator().manual_seed(3))
    experts, w = routing(9, 4)
    got = ge.ffn_rows(x, experts, w).double()

    def deq(s: tuple, n: int, k: int, name: str) -> list[torch.Tensor]:
        return [torch.from_numpy(dequantized(r.numpy(), name, n, k)) for r in s[2]]

    wg, wu, wd = deq(gate, FF, H, tgu), deq(up, FF, H, tgu), deq(down, H, FF, tdown)
    want = torch.zeros(9, H, dtype=torch.float64)
    for t in range(9):
        for j in range(TOP):
            e, xt = int(experts[t, j]), x[t].double()
            a = F.silu(wg[e] @ xt) * (wu[e] @ xt)
            want[t] += w[t, j].double() * (wd[e] @ a)
    err = (got - want).abs().max() / want.abs().max()
    assert err < 0.03, f"relative error {err:.4f}"


@pytest.mark.parametrize("fused", [False, True], ids=["gate+up", "fused-gate_up"])
def test_adapters_on_quantized_experts(fused: bool) -> None:
    """The staged path with adapters equals the per-expert loop with the same deltas, and a
    token without an adapter in that step equals its one-call answer."""
    rng = np.random.default_rng(5)
    p = "blk.0."

    def mats(name: str, n: int, k: int) -> list[Matrix]:
        t = GGML_TYPE[name]
        return [Matrix.from_raw(p, torch.from_numpy(random_rows(rng, name, n, k)), t, (n, k))
                for _ in range(E)]  # fmt: skip

    tensors = {p + "ffn_down_exps.weight": mats("Q6_K", H, FF)}
    if fused:
        tensors[p + "ffn_gate_up_exps.weight"] = mats("Q8_0", 2 * FF, H)
    else:
        tensors[p + "ffn_gate_exps.weight"] = mats("Q4_K", FF, H)
        tensors[p + "ffn_up_exps.weight"] = mats("Q4_K", FF, H)
    cfg = SimpleNamespace(act="silu", expert_weight_input=False)
    routed = RoutedExperts(cfg, p, ExpertWeights(tensors, {}))  # type: ignore[arg-type]
    assert routed.grouped is not None
    g = torch.Generator().manual_seed(9)
    x = torch.randn(24, H, generator=g)
    experts, w = routing(24, 6)
    scales = torch.where(torch.arange(24) % 3 == 0, 0.0, torch.rand(24, generator=g) + 0.5)
    lora = ExpertLora(scales, 100)
    staged = routed(x, experts, w, lora)
    assert lora.calls > 0
    grouped, routed.grouped = routed.grouped, None
    loop = routed(x, experts, w, lora)
    routed.grouped = grouped
    plain = routed(x, experts, w, None)
    assert torch.equal(staged, loop)
    bare = scales == 0
    assert torch.equal(staged[bare], plain[bare])
    assert (staged[~bare] - plain[~bare]).abs().amax(-1).min() > 0  # every adapted row moved
