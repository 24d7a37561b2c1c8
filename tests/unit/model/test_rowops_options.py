"""Row operations the new architectures bring (loraserve/kernels/rowops.c and its fallback):
gpt-oss's clamped gated activation (llama.cpp's ggml_swiglu_oai), logit soft-capping
(gemma2's final logits) and LayerNorm (cohere2). Each equals its float64 formula, and a
value's bits do not depend on its row's neighbours or on where it lies in the row (vector
lanes or the tail).
"""

from __future__ import annotations

import pytest
import torch

from loraserve.kernels import rowops

BACKENDS = ["c", "torch"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on the C kernels (skipped where there are none) or the torch fallbacks."""
    if request.param == "c":
        if rowops._c() is None:
            pytest.skip("no C kernels here")
    else:
        monkeypatch.setattr(rowops, "_c", lambda: None)
    return request.param


def swiglu_oai64(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """ggml_compute_forward_swiglu_oai_f32 in float64: alpha 1.702, limit 7."""
    x = gate.double().clamp(max=7.0)
    y = up.double().clamp(-7.0, 7.0)
    return x / (1.0 + torch.exp(-1.702 * x)) * (y + 1.0)


def test_swiglu_oai_matches_float64(backend: str) -> None:
    """Values across the clamp limits (gate and up both past +-7) equal the float64 formula."""
    g = torch.Generator().manual_seed(0)
    gu = torch.randn(9, 2 * 45, generator=g) * 6  # fused gate|up rows, F = 45 (odd tail)
    gu[0, :10] = torch.tensor([-100.0, -7.5, -7.0, -1e-3, 0.0, 1e-3, 6.99, 7.0, 7.01, 80.0])
    gu[0, 45:55] = gu[0, :10].flip(0)
    gate, up = gu[:, :45], gu[:, 45:]
    got = rowops.gated_act(gate, up, "swiglu_oai")
    want = swiglu_oai64(gate, up)
    assert got.shape == (9, 45) and got.dtype == torch.float32
    assert ((got.double() - want).abs() <= 1e-6 * want.abs() + 1e-6).all()


@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "swiglu_oai"])
def test_gated_act_value_bits_independent_of_place(backend: str, act: str) -> None:
    """A row alone equals that row inside a batch, and a value in the vector part equals the
    same value in the scalar tail, bitwise (the C kernel's promise; torch's elementwise ops
    vectorize by position in the whole tensor, so the fallback does not keep it)."""
    if backend != "c":
        pytest.skip("a C kernel property")
    g = torch.Generator().manual_seed(1)
    gate, up = torch.randn(7, 37, generator=g) * 5, torch.randn(7, 37, generator=g) * 5
    batch = rowops.gated_act(gate, up, act)
    for r in range(7):
        assert torch.equal(rowops.gated_act(gate[r : r + 1], up[r : r + 1], act)[0], batch[r])
    # column 3 (in a vector of 8) and column 36 (the tail) hold the same pair
    gate[:, 36], up[:, 36] = gate[:, 3], up[:, 3]
    out = rowops.gated_act(gate, up, act)
    assert torch.equal(out[:, 36], out[:, 3])


def test_softcap_matches_float64_and_saturates(backend: str) -> None:
    """cap * tanh(x / cap) within 1e-6 of cap (relative to the cap), +-cap far out, NaN kept."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 1001, generator=g) * 40
    x[0, :6] = torch.tensor([1e30, -1e30, 0.0, 1e-6, -3000.0, float("nan")])
    want = 30.0 * torch.tanh(x.double() / 30.0)
    got = rowops.softcap_(x.clone(), 30.0)
    assert got[0, 5].isnan()
    ok = torch.ones_like(want, dtype=torch.bool)
    ok[0, 5] = False
    assert ((got.double() - want).abs()[ok] <= 30.0 * 1e-6).all()
    assert got[0, 0] == 30.0 and got[0, 1] == -30.0 and got[0, 2] == 0.0


def test_softcap_value_bits_independent_of_place(backend: str) -> None:
    """A row alone equals that row in a batch; a value in a vector equals it in the tail (the
    C kernel's promise, as for the gated activation)."""
    if backend != "c":
        pytest.skip("a C kernel property")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 203, generator=g) * 50
    x[:, 202] = x[:, 9]
    batch = rowops.softcap_(x.clone(), 50.0)
    assert torch.equal(batch[:, 202], batch[:, 9])
    for r in range(6):
        assert torch.equal(rowops.softcap_(x[r : r + 1].clone(), 50.0)[0], batch[r])


def test_layer_norm_matches_float64(backend: str) -> None:
    """LayerNorm (mean and biased variance of the row, weight, optional bias) equals float64,
    on rows that are views into wider rows, with and without a bias."""
    g = torch.Generator().manual_seed(4)
    wide = torch.randn(6, 300, generator=g) * 3 + 5  # an offset mean: no cancellation trick
    x = wide[:, :259]  # [6, 259] rows at stride 300
    w, b = torch.randn(259, generator=g), torch.randn(259, generator=g)
    for bias in (None, b):
        got = rowops.layer_norm(x, w, bias, 1e-5)
        xd = x.double()
        mean = xd.mean(-1, keepdim=True)
        want = (xd - mean) / torch.sqrt(((xd - mean) ** 2).mean(-1, keepdim=True) + 1e-5)
        want = want * w.double() + (0 if bias is None else bias.double())
        assert got.shape == (6, 259) and got.is_contiguous()
        assert ((got.double() - want).abs() <= 1e-5 * (1 + want.abs())).all()


def test_layer_norm_row_alone_equals_row_in_batch(backend: str) -> None:
    """A row's LayerNorm bits do not depend on the other rows (C kernel's promise)."""
    if backend != "c":
        pytest.skip("a C kernel property")
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(9, 203, generator=g), torch.randn(203, generator=g)
    batch = rowops.layer_norm(x, w, None, 1e-5)
    for r in range(9):
        assert torch.equal(rowops.layer_norm(x[r : r + 1], w, None, 1e-5)[0], batch[r])
