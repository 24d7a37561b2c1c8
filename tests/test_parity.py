"""Float32 logits of loraserve's decoder equal transformers' on the same weights."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.model.loader import LoadedModel, load_model
from tests.tiny import hf_logits, hf_model, write_gguf

IDS = [1, 5, 77, 300, 12, 9, 260, 261, 262, 200, 150, 33, 7, 8, 99, 100, 101, 310, 4]


def our_logits(model: LoadedModel, ids: list[int], chunk: int) -> torch.Tensor:
    """Logits [T, V] computed by prefill chunks of ``chunk`` tokens then one-token decodes."""
    runner = ModelRunner(model.decoder, block_size=4, kv_dtype=torch.float32)
    n_blocks = (len(ids) + 3) // 4
    runner.ensure_capacity(n_blocks + 2)
    blocks = list(range(2, 2 + n_blocks))[::-1]  # non-trivial block table
    rows = []
    pos = 0
    while pos < len(ids):
        n = chunk if pos == 0 else 1
        n = min(n, len(ids) - pos)
        item = BatchItem(ids, pos, n, blocks, want_logits=True, lora_mix={}, generated=pos > 0)
        _, _, ctx = runner._context([item])
        ctx.logits_rows = torch.arange(n)
        from loraserve.model.context import set_context

        set_context(ctx)
        try:
            rows.append(model.decoder(torch.tensor(ids[pos : pos + n]), torch.arange(pos, pos + n)))
        finally:
            set_context(None)
        pos += n
    return torch.cat(rows)


CASES = {
    "llama": ("llama", {}, None),
    "llama-quant": (
        "llama",
        {},
        {
            "blk.0.attn_q.weight": Q.Q4_K,
            "blk.0.attn_k.weight": Q.Q5_0,
            "blk.0.ffn_down.weight": Q.Q6_K,
            "blk.1.attn_v.weight": Q.Q8_0,
            "blk.1.ffn_gate.weight": Q.Q5_K,
            "blk.1.attn_output.weight": Q.Q3_K,
            "output.weight": Q.Q2_K,
            "token_embd.weight": Q.Q4_0,
        },
    ),
    "gemma3": ("gemma3", {}, None),
    "gemma3-quant": (
        "gemma3",
        {},
        {
            "token_embd.weight": Q.Q8_0,
            "blk.0.attn_q.weight": Q.Q5_0,
            "blk.2.ffn_down.weight": Q.Q6_K,
            "blk.5.ffn_up.weight": Q.Q4_K,
        },
    ),
    "qwen2": ("qwen2", {}, None),
    "qwen3": ("qwen3", {}, None),
    "mixtral": ("mixtral", {}, None),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("chunk", [19, 6])
def test_logits_equal_transformers(tmp_path, case: str, chunk: int) -> None:
    arch, over, quant = CASES[case]
    if quant:  # K-quants need rows that are multiples of 256
        over = {"hidden_size": 256, "intermediate_size": 256, **over}
    m = hf_model(arch, **over)
    path = write_gguf(tmp_path / "m.gguf", m, arch, quant)
    ours = our_logits(load_model(path), IDS, chunk)
    ref = hf_logits(m, IDS)
    assert ours.shape == ref.shape
    diff = (ours - ref).abs().max().item()
    assert diff <= 1e-4, f"{case}: max abs logit diff {diff}"
    assert ref.std() > 0.1  # the comparison is not between near-constant logits


def test_hf_folder_equals_transformers(tmp_path) -> None:
    m = hf_model("gemma3")
    m.save_pretrained(tmp_path)
    _write_hf_tokenizer(tmp_path)
    ours = our_logits(load_model(tmp_path), IDS, 7)
    diff = (ours - hf_logits(m, IDS)).abs().max().item()
    assert diff <= 1e-4


def test_hf_folder_mixtral(tmp_path) -> None:
    m = hf_model("mixtral")
    m.save_pretrained(tmp_path)
    _write_hf_tokenizer(tmp_path)
    ours = our_logits(load_model(tmp_path), IDS, 19)
    assert (ours - hf_logits(m, IDS)).abs().max().item() <= 1e-4


def _write_hf_tokenizer(path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.tiny import tiny_vocab

    tokens, _, _ = tiny_vocab()
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
