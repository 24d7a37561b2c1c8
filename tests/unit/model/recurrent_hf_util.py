"""Our float32 logits against transformers' on the same random weights: the prompt, both sides'
log-probabilities of its every position, and the comparison (test_recurrent_hf.py,
test_deltanet_hf.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.model.gguf_write import write_gguf
from loraserve.model.loader import load_model
from tests.arch_models import typed_metadata

PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, 128, 37)]  # the test vocabulary


def ours_logits(
    tmp: Path, name: str, spec: dict[str, Any], values: dict[str, np.ndarray], chunk: int = 0
) -> Any:
    """loraserve's float32 log-probabilities [len(PROMPT), V] of every position of PROMPT, on
    ``spec``'s metadata with ``values`` written by its GGUF writer (blocks of 4); ``chunk``
    > 0: delta-net and Mamba-2 scans in the chunked form."""
    path = write_gguf(tmp / f"{name}.gguf", typed_metadata(spec["metadata"]), values)
    m = load_model(path, scan_chunk=chunk)
    runner = ModelRunner(m.decoder, 4, torch.float32)
    runner.ensure_capacity(16)
    item = BatchItem(PROMPT, 0, len(PROMPT), list(range(16)), True, {}, n_logits=len(PROMPT))
    return runner.forward([item]).log_softmax(-1)


def compare(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Log-probabilities within 1e-3, the same argmax wherever the top two differ by more."""
    assert (ours - theirs).abs().max() < 1e-3
    top2 = theirs.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3
    assert torch.equal(ours.argmax(-1)[clear], theirs.argmax(-1)[clear])


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A torch view of a (contiguous copy of a) numpy array."""
    return torch.from_numpy(np.ascontiguousarray(a))


def hf_prompt_logits(model: torch.nn.Module, sd: dict[str, torch.Tensor]) -> torch.Tensor:
    """transformers' log-probabilities [len(PROMPT), V] of PROMPT with the state dict ``sd``
    loaded (only rotary buffers and a tied lm_head may be missing)."""
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in k or "lm_head" in k for k in missing), missing
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([PROMPT]), use_cache=False).logits[0].float()
    return out.log_softmax(-1)
