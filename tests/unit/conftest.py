"""Fixtures shared by the unit tests of several folders."""

from __future__ import annotations

import pytest

from tests.unit.lora.lora_util import Tiny, tiny


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """The tiny transformers llama (hidden 64, ffn 96) and its GGUF loaded by loraserve."""
    return tiny(tmp_path_factory, "llama")
