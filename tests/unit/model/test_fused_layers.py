"""The fused layers (one C call for every layer of a step without LoRA) give exactly the
Python path's bits, and the C gated activation is accurate against float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraserve.kernels import backend
from loraserve.kernels.rowops import gated_act
from tests.tiny import our_logits
from tests.unit.model.quant_util import quantized_model

needs_c = pytest.mark.skipif(backend() != "c", reason="no C compiler here")


@needs_c
@pytest.mark.parametrize("arch", ["gemma3", "qwen2", "llama"])
def test_fused_layers_equal_the_python_path_bitwise(tmp_path, arch: str) -> None:
    over = {"sliding_window": 5} if arch == "gemma3" else {}
    model = quantized_model(tmp_path, arch, **over)
    dec = model.decoder
    assert dec._fused() is not None, "the quantized dense model should take the fused path"
    ids = torch.randint(3, 300, (19,), generator=torch.Generator().manual_seed(1)).tolist()
    runs = {}
    for fused in (True, False):
        dec.use_fused = fused
        runs[fused] = [our_logits(model, ids, chunk) for chunk in (19, 6, 1)]
    dec.use_fused = True
    for a, b in zip(runs[True], runs[False], strict=True):
        assert torch.equal(a, b)
    # and chunking changes no bit either (the fused path's own promise)
    assert torch.equal(runs[True][0], runs[True][1]) and torch.equal(runs[True][0], runs[True][2])


@needs_c
@pytest.mark.parametrize("arch", ["gemma3", "qwen2"])
def test_fused_lora_deltas_equal_the_python_path_bitwise(tmp_path, arch: str) -> None:
    """Steps with adapters run in the same C call: each mix's logits equal the Python path's
    (which adds each projection's delta between the kernels), in batches of mixed mixes."""
    from loraserve.engine.runner import BatchItem, ModelRunner
    from loraserve.lora.registry import AdapterRegistry
    from tests.unit.lora.lora_util import peft_adapter

    model, m = quantized_model(tmp_path, arch, with_hf=True)
    reg = AdapterRegistry(model)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for i, tm in enumerate((targets, ["v_proj", "down_proj"])):  # different target sets
        reg.load(peft_adapter(tmp_path / f"a{i}", m, seed=i, target_modules=tm)[0])
    ids = [torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(n)).tolist()
           for n in (9, 5, 7)]  # fmt: skip
    mixes = [{0: 1.0}, {0: 0.5, 1: -1.5}, {}]

    def run(fused: bool) -> list[torch.Tensor]:
        model.decoder.use_fused = fused
        runner = ModelRunner(model.decoder, 4, torch.float32, lora=reg.build_delta)
        runner.ensure_capacity(12)
        tables = [[0, 1, 2], [3, 4], [5, 6, 7]]
        seqs = list(zip(ids, tables, mixes, strict=True))
        out = [runner.forward([BatchItem(t, 0, len(t), b, True, mx) for t, b, mx in seqs])]
        for p in range(2):  # two decode steps of all three
            step = [BatchItem(t + [7, 8], len(t) + p, 1, b, True, mx) for t, b, mx in seqs]
            out.append(runner.forward(step))
        return out

    got, ref = run(True), run(False)
    model.decoder.use_fused = True
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(got[0][0], got[0][2])  # the adapters really change the logits


@needs_c
def test_fused_layers_refuse_bad_metadata_with_a_clear_error(tmp_path) -> None:
    model = quantized_model(tmp_path, "llama")
    fused = model.decoder._fused()
    assert fused is not None
    d = model.config
    kv = [(torch.zeros(8, d.n_kv_heads, d.head_dim), torch.zeros(8, d.n_kv_heads, d.head_dim))
          for _ in range(d.n_layers)]  # fmt: skip
    x = torch.zeros(1, d.hidden_size)
    cos = sin = torch.zeros(1, d.head_dim // 2)
    one = torch.tensor([0])
    with pytest.raises(ValueError, match="inconsistent"):  # slot 99 is outside the pool
        fused(x, torch.tensor([99]), one, torch.tensor([0, 1]), one, torch.tensor([1]), 0,
              (cos, sin), (cos, sin), kv)  # fmt: skip
    with pytest.raises(ValueError, match="KV pools"):
        fused(x, one, one, torch.tensor([0, 1]), one, torch.tensor([1]), 0, (cos, sin),
              (cos, sin), kv[:1])  # fmt: skip


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gated_activation_matches_float64_and_is_row_independent(act: str) -> None:
    g = torch.randn(33, 2 * 203, generator=torch.Generator().manual_seed(0)) * 4
    gate, up = g[:, :203], g[:, 203:]  # views of one fused output, as the decoder passes
    y = gated_act(gate, up, act)
    ref = F.silu(gate.double()) if act == "silu" else F.gelu(gate.double(), approximate="tanh")
    ref = ref * up.double()
    big = ref.abs() > 1e-6
    rel = ((y.double() - ref).abs() / ref.abs())[big]
    assert rel.max() < 1e-5
    assert ((y.double() - ref).abs()[~big]).max() < 1e-6
    for r in (0, 7, 32):  # a row alone gives the same bits (the 203 % 8 tail included)
        assert torch.equal(gated_act(gate[r : r + 1], up[r : r + 1], act)[0], y[r])
    bad = gated_act(torch.tensor([[float("nan"), 1.0]]), torch.ones(1, 2), act)
    assert bad[0, 0].isnan() and bad[0, 1].isfinite()


@needs_c
@pytest.mark.parametrize("rank", [3, 8, 16, 21])
def test_transposed_lora_route_gives_the_same_bits(rank: int) -> None:
    """ls_lora's route through B transposed (8 outputs as one vector, what the fused layers
    use) equals its one-dot-per-output route bitwise, for ranks around the vector width and
    an output count that leaves a tail."""
    import ctypes

    from loraserve.kernels.floatmm import _cf

    lib = _cf()
    g = torch.Generator().manual_seed(rank)
    t, k, n = 5, 72, 203
    x = torch.randn(t, k, generator=g)
    a = [torch.randn(rank, k, generator=g), torch.randn(rank + 2, k, generator=g)]
    b = [torch.randn(n, rank, generator=g), torch.randn(n, rank + 2, generator=g)]
    bt = [m.t().contiguous() for m in b]
    s = torch.randn(2, t, generator=g)
    s[1, 2] = 0.0  # a row without the second adapter
    ptrs = ctypes.c_void_p * 2

    def run(with_bt: bool) -> torch.Tensor:
        y = torch.randn(t, n, generator=torch.Generator().manual_seed(0))
        rc = lib.ls_lora(2, ptrs(*[m.data_ptr() for m in a]), ptrs(*[m.data_ptr() for m in b]),
                         ptrs(*[m.data_ptr() for m in bt]) if with_bt else None,
                         (ctypes.c_int64 * 2)(rank, rank + 2), s.data_ptr(), x.data_ptr(), k, t,
                         k, y.data_ptr(), n, n, 2)  # fmt: skip
        assert rc == 0
        return y

    assert torch.equal(run(True), run(False))
