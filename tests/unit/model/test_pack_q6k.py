"""Q6_K experts repacked 8 rows to a group (`kernels/pack_q6k.h`) and the grouped MoE call's
workspace and adapter path (`kernels/moe.c`, `model/ffn/routed.py`).

Oracles: the file's bytes (the packing is a permutation: unpacked, the same rows again); the
Q6_K rows in their own layout through the grouped and the single-matrix kernels (bitwise:
the same integer sums and float steps by design), in both the AVX-512 and the AVX2 build;
gguf-py's float64 dequantization within the activation quantization's error.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import loraserve.kernels as K
from loraserve.kernels.moe import GroupedExperts
from loraserve.kernels.pack_q6k import pack_q6k, packable_q6k, unpack_q6k
from loraserve.lora.delta import LoraBatch
from loraserve.model.ffn.routed import RoutedExperts
from loraserve.model.projection import Matrix
from tests.unit.model.moe_util import ExpertLora, ExpertWeights
from tests.unit.model.quant_util import ROOT, dequantized, has_vnni, random_rows, run_python

pytestmark = pytest.mark.skipif(K.backend() != "c", reason="packed Q6_K needs the C kernels")
Q6, Q4 = 14, 12


@pytest.mark.parametrize(("n", "k"), [(8, 256), (24, 768), (16, 1024)])
def test_unpack_gives_the_file_rows_again(n: int, k: int) -> None:
    raw = torch.from_numpy(random_rows(np.random.default_rng(n + k), "Q6_K", n, k))
    packed = pack_q6k(raw, k)
    assert packed.shape == raw.shape and not torch.equal(packed, raw)
    assert torch.equal(unpack_q6k(packed, k), raw)
    assert not packable_q6k(raw[:4], k) and not packable_q6k(raw, 320)


def _experts(rng: np.random.Generator, e: int, h: int, f: int) -> tuple[list, list, list]:
    gate = [torch.from_numpy(random_rows(rng, "Q4_K", f, h)) for _ in range(e)]
    up = [torch.from_numpy(random_rows(rng, "Q4_K", f, h)) for _ in range(e)]
    down = [torch.from_numpy(random_rows(rng, "Q6_K", h, f)) for _ in range(e)]
    return gate, up, down


def test_packed_q6k_equals_the_row_layout_bitwise() -> None:
    """Every expert row count from 1 to 23 (tiles of 1..4 activation rows, the many-row
    tasks), one call and staged, and each row alone through `qmatmul` on the file rows."""
    rng = np.random.default_rng(3)
    e, h, f = 6, 256, 512
    gate, up, down = _experts(rng, e, h, f)
    plain = GroupedExperts([(gate, Q4), (up, Q4)], (down, Q6), "silu")
    packed = GroupedExperts([(gate, Q4), (up, Q4)], ([pack_q6k(d, f) for d in down],
                                                     K.PACKED | Q6), "silu")  # fmt: skip
    g = torch.Generator().manual_seed(4)
    counts = [1, 2, 3, 5, 11, 23]  # rows of expert i: tokens routed to it (k = 1)
    experts = torch.cat([torch.full((c,), i) for i, c in enumerate(counts)]).unsqueeze(1)
    x = torch.randn(experts.shape[0], h, generator=g)
    w = torch.rand(experts.shape[0], 1, generator=g)
    got = packed.ffn_rows(x, experts, w)
    assert torch.equal(got, plain.ffn_rows(x, experts, w))
    r = packed.route(experts)
    a = packed.act_rows(packed.gate_up(x, r), r)  # [P, f] sorted
    d = packed.down(a, r)
    assert torch.equal(d, plain.down(a, r))
    for s in range(a.shape[0]):  # each sorted row alone through the single-matrix kernel
        ex = int(experts[r.pair[s], 0])
        want = K.qmatmul(K.quantize_rows(a[s : s + 1], 256), down[ex], Q6)
        assert torch.equal(d[s : s + 1], want), f"row {s}"
    # gguf-py's float64 values of the file rows
    for s in range(0, a.shape[0], 7):
        ex = int(experts[r.pair[s], 0])
        ref = torch.from_numpy(dequantized(down[ex].numpy(), "Q6_K", h, f)) @ a[s].double()
        assert ((d[s].double() - ref).abs().max() / ref.abs().max()) < 0.02


ISA_CODE = r"""
import hashlib, json, sys
import numpy as np, torch
sys.path.insert(0, {root!r})
from loraserve import cbuild
import loraserve.kernels as K
from loraserve.kernels.moe import GroupedExperts
from loraserve.kernels.pack_q6k import pack_q6k
from tests.unit.model.quant_util import random_rows
rng = np.random.default_rng(5)
rows = lambda t, n, k: [torch.from_numpy(random_rows(rng, t, n, k)) for _ in range(3)]
gate, up, down = rows("Q4_K", 256, 256), rows("Q4_K", 256, 256), rows("Q6_K", 256, 256)
ge = GroupedExperts([(gate, 12), (up, 12)], ([pack_q6k(d, 256) for d in down], 256 | 14),
                    "silu")
h = hashlib.sha256()
for t in (1, 2, 3, 4, 7, 30):
    x = torch.from_numpy(rng.standard_normal((t, 256)).astype(np.float32))
    ex = torch.from_numpy(rng.integers(0, 3, size=(t, 2)))
    h.update(ge.ffn_rows(x, ex, torch.full((t, 2), 0.5)).numpy().tobytes())
print(json.dumps({{"isa": cbuild.library().ls_isa(), "sha": h.hexdigest()}}))
"""


@pytest.mark.skipif(not has_vnni(), reason="this CPU has no AVX-512 VNNI")
def test_packed_q6k_same_bits_in_avx512_and_avx2_builds() -> None:
    code = ISA_CODE.format(root=ROOT)
    native = run_python(code, {})
    avx2 = run_python(code, {"LORASERVE_KERNEL_NO_AVX512": "1"})  # its own key in the cache
    assert native["isa"] == 7 and avx2["isa"] == 1
    assert native["sha"] == avx2["sha"]


class _Targeted(ExpertLora):
    """`ExpertLora` that says which stacked targets its adapters adapt (as `LoraBatch.targets`)."""

    def __init__(self, scales: torch.Tensor, seed: int, names: set[str]) -> None:
        super().__init__(scales, seed)
        self.names = names

    def targets(self, target: str) -> bool:
        return target in self.names


def test_adapters_without_expert_targets_keep_the_one_call() -> None:
    rng = np.random.default_rng(8)
    p, e, h, f = "blk.0.", 4, 256, 256
    gate, up, down = _experts(rng, e, h, f)
    tensors = {p + n: [Matrix.from_raw(p + n, r, t, tuple(r.shape[:1]) + (s,))
                       for r in rs]  # fmt: skip
               for n, rs, t, s in (("ffn_gate_exps.weight", gate, Q4, h),
                                   ("ffn_up_exps.weight", up, Q4, h),
                                   ("ffn_down_exps.weight", down, Q6, f))}  # fmt: skip
    cfg = SimpleNamespace(act="silu", expert_weight_input=False)
    routed = RoutedExperts(cfg, p, ExpertWeights(tensors, {}))  # type: ignore[arg-type]
    # packed at load (`Matrix.pack`: dense Q6_K packing is pack_q6k.h's layout)
    assert routed.grouped is not None and routed.down[0].kernel_type == K.PACKED | Q6
    assert torch.equal(routed.down[2].data, pack_q6k(down[2], f))
    assert torch.equal(routed.down[2].file_rows(), down[2])
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, h, generator=g)
    experts = torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(12)])
    w = torch.rand(12, 2, generator=g)
    scales = torch.rand(12, generator=g) + 0.5
    plain = routed(x, experts, w, None)
    other = _Targeted(scales, 1, {"blk.0.attn_q.weight", "blk.1.ffn_down_exps.weight"})
    assert torch.equal(routed(x, experts, w, other), plain) and other.calls == 0
    mine = _Targeted(scales, 1, {p + "ffn_down_exps.weight"})
    out = routed(x, experts, w, mine)
    assert mine.calls > 0 and (out - plain).abs().amax(-1).min() > 0
    # the loop path (float experts or no kernels) reads the packed matrices as file rows
    grouped, routed.grouped = routed.grouped, None
    assert torch.equal(routed(x, experts, w, mine), out)
    routed.grouped = grouped


def test_lora_batch_says_which_targets_its_active_adapters_adapt() -> None:
    """`LoraBatch.targets`, which the experts ask: adapters of the step's mixes only, and
    an adapter at scale 0 everywhere is not active."""
    attn, down = "blk.0.attn_q.weight", "blk.0.ffn_down_exps.weight"
    ads = {1: SimpleNamespace(weights={attn: None}), 2: SimpleNamespace(weights={down: None})}
    only_attn = LoraBatch([(0, 4, {1: 1.0})], ads)  # type: ignore[arg-type]
    assert only_attn.targets(attn) and not only_attn.targets(down)
    both = LoraBatch([(0, 2, {1: 1.0}), (2, 4, {2: 0.5})], ads)  # type: ignore[arg-type]
    assert both.targets(down) and not both.targets("blk.1.ffn_down_exps.weight")
    assert not LoraBatch([(0, 4, {1: 1.0, 2: 0.0})], ads).targets(down)  # type: ignore[arg-type]


RSS_CODE = r"""
import gc, json, sys
import numpy as np, torch
sys.path.insert(0, {root!r})
from loraserve.kernels import moe
from tests.unit.model.quant_util import random_rows
torch.set_num_threads(1)
rng = np.random.default_rng(1)
rows = lambda t, n, k: [torch.from_numpy(random_rows(rng, t, n, k)) for _ in range(4)]
gate, up, down = rows("Q4_K", 256, 256), rows("Q4_K", 256, 256), rows("Q6_K", 256, 256)
x = torch.randn(2048, 256)
ex = torch.from_numpy(rng.integers(0, 4, size=(2048, 2)))
w = torch.rand(2048, 2)

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

out = {{"kept": [], "after": [], "rss": []}}
for _ in range(4):  # a model loaded, run on a prompt, unloaded
    ge = moe.GroupedExperts([(gate, 12), (up, 12)], (down, 14), "silu")
    ge.ffn_rows(x, ex, w)
    out["kept"].append(moe.workspace_bytes())
    del ge
    gc.collect()
    out["after"].append(moe.workspace_bytes())
    out["rss"].append(rss())
print(json.dumps(out))
"""


def test_workspace_is_freed_when_the_last_layer_goes() -> None:
    """The kept workspace (~16 MB here) is unmapped at unload: repeated loads neither keep
    it nor grow the resident set."""
    out = run_python(RSS_CODE.format(root=ROOT), {})
    assert all(k > 8 << 20 for k in out["kept"]), out
    assert out["after"] == [0, 0, 0, 0]
    assert out["rss"][-1] - out["rss"][0] < 8 << 20, out["rss"]
