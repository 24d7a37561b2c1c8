"""Fixtures shared by the kernel tests of this folder."""

from __future__ import annotations

import pytest

import loraserve.kernels as K
import loraserve.kernels.floatmm as FM


@pytest.fixture(params=["c", "torch"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on the C kernels (skipped where none were built) or the torch fallbacks."""
    if request.param == "c" and K.backend() != "c":
        pytest.skip("no C compiler on this machine")
    if request.param == "torch":
        monkeypatch.setattr(K, "_c", lambda: None)
        monkeypatch.setattr(FM, "_cf", lambda: None)
    return request.param
