"""Float32 logits of loraserve's decoder equal transformers' on the same weights."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q

from loraserve.model.loader import load_model
from tests.tiny import hf_logits, hf_model, our_logits, write_gguf

IDS = [1, 5, 77, 300, 12, 9, 260, 261, 262, 200, 150, 33, 7, 8, 99, 100, 101, 310, 4]


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
    "gemma2": ("gemma2", {}, None),  # soft-capped scores and logits, alternating windows
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
    ours = our_logits(load_model(path, "float32"), IDS, chunk)
    ref = hf_logits(m, IDS)
    assert ours.shape == ref.shape
    diff = (ours - ref).abs().max().item()
    assert diff <= 1e-4, f"{case}: max abs logit diff {diff}"
    assert ref.std() > 0.1  # the comparison is not between near-constant logits


@pytest.mark.parametrize("case", ["llama-quant", "gemma3-quant"])
def test_native_logits_follow_transformers(tmp_path, case: str) -> None:
    """The default precision on quantized files: transformers' float32 forward over the same
    dequantized weights, up to the int8 rounding of activations (llama.cpp's schemes: Q8_0,
    one scale per 32, for the legacy types; Q8_K, one per 256, for the K-quants, whose
    rounding is coarser: the llama case has a Q2_K output and a Q3_K attention output):
    the same top-1 wherever transformers' top-1/top-2 gap is clear, and close logits."""
    arch, over, quant = CASES[case]
    m = hf_model(arch, **{"hidden_size": 256, "intermediate_size": 256, **over})
    path = write_gguf(tmp_path / "m.gguf", m, arch, quant)
    model = load_model(path)
    assert any(p.quantized for b in model.decoder.blocks for p in b.qkv.parts)
    ours = our_logits(model, IDS, 7)
    ref = hf_logits(m, IDS)
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) >= 0.5
    assert clear.sum() >= 3
    assert (ours.argmax(-1) == ref.argmax(-1))[clear].all()
    assert (ours - ref).abs().max() <= 0.1 * (ref.max() - ref.min())


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


def test_hf_folder_in_bfloat16_stays_bfloat16(tmp_path) -> None:
    """A bfloat16 checkpoint runs on its own bfloat16 weights (no float32 copy) and equals
    transformers' float32 forward over the same (bfloat16-rounded) weights."""
    import copy

    import torch

    m = hf_model("gemma3")
    with torch.no_grad():  # the reference: float32 buffers (rope), bfloat16-rounded weights
        for p in m.parameters():
            p.copy_(p.bfloat16().float())
    copy.deepcopy(m).to(torch.bfloat16).save_pretrained(tmp_path)
    _write_hf_tokenizer(tmp_path)
    model = load_model(tmp_path)
    assert all(p.data.dtype == torch.bfloat16 for b in model.decoder.blocks for p in b.qkv.parts)
    ours = our_logits(model, IDS, 7)
    assert (ours - hf_logits(m, IDS)).abs().max().item() <= 1e-4


def _write_hf_tokenizer(path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.tiny import tiny_vocab

    tokens, _, _ = tiny_vocab()
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
