"""Layer kinds checked against independent references (the models that use them are checked
against llama-server in test_archs.py):

- chunked attention (llama4) equals softmax attention over each query's own chunk, computed
  in float64 from the definition, and a row's bits do not depend on the batch;
- YaRN rope tables equal transformers' YaRN (inverse frequencies and attention factor), and
  deepseek2's softmax scale equals transformers' DeepseekV2Attention's;
- a partial rope equals rotating the first dims alone, the rest untouched.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from loraserve.model.archs import Keys
from loraserve.model.attn.paged import paged_attention
from loraserve.model.attn.rope_scaling import ScaledRope, read_scaling
from loraserve.model.attn.variants import partial_rope
from loraserve.model.config import ModelConfig
from loraserve.model.context import AttnMeta, StepContext
from loraserve.model.layers import Rope
from tests.arch_models import typed_metadata

DATA = Path(__file__).resolve().parents[2] / "data" / "archs"


def _ctx(lengths: list[int], rows: list[tuple[int, int]], pool: int, seed: int) -> StepContext:
    """A step whose query rows are (sequence, position) pairs over sequences of ``lengths``
    keys, stored at random pool slots."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(pool, generator=g)
    slots, offs, start = [], [0], 0
    for n in lengths:
        slots.append(perm[start : start + n])
        start += n
        offs.append(start)
    meta = AttnMeta(
        torch.cat(slots),
        torch.tensor(offs),
        torch.tensor([b for b, _ in rows], dtype=torch.int32),
        torch.tensor([p + 1 for _, p in rows], dtype=torch.int32),
    )
    return StepContext(slot_mapping=torch.empty(0, dtype=torch.long), attn=meta,
                       logits_rows=torch.empty(0, dtype=torch.long))  # fmt: skip


@pytest.mark.parametrize("chunk", [4, 5])
def test_chunked_attention_attends_its_own_chunk(chunk: int) -> None:
    lengths, pool, h, hkv, d = [13, 7, 9], 64, 4, 2, 16
    rows = [(b, p) for b, n in enumerate(lengths) for p in range(n)]
    ctx = _ctx(lengths, rows, pool, 0)
    g = torch.Generator().manual_seed(1)
    kc, vc = torch.randn(pool, hkv, d, generator=g), torch.randn(pool, hkv, d, generator=g)
    q = torch.randn(len(rows), h, d, generator=g)
    none = torch.empty(0, hkv, d)
    ctx.slot_mapping = torch.empty(0, dtype=torch.long)
    out = paged_attention(q, none, none, kc, vc, ctx, 0.25, False, chunk=chunk)
    for t, (b, p) in enumerate(rows):
        seq = ctx.attn.slots[ctx.attn.seq_off[b] : ctx.attn.seq_off[b + 1]]
        keys = seq[p // chunk * chunk : p + 1]  # the query's own chunk, up to itself
        k, v = kc[keys].double(), vc[keys].double()  # [m, Hkv, D]
        for head in range(h):
            kv = head // (h // hkv)
            w = torch.softmax(0.25 * (k[:, kv] @ q[t, head].double()), 0)
            want = w @ v[:, kv]
            assert torch.allclose(out[t, head].double(), want, atol=1e-5), (t, head)
    # a row alone gives the same bits as in the batch
    for t in (0, 6, 12, 15, 25):
        alone = _ctx(lengths, [rows[t]], pool, 0)
        one = paged_attention(q[t : t + 1], none, none, kc, vc, alone, 0.25, False, chunk=chunk)
        assert torch.equal(one[0], out[t])


def test_yarn_tables_equal_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, base, factor, orig = 64, 10000.0, 4.0, 256
    hf = LlamaConfig(hidden_size=2 * d, num_attention_heads=2, head_dim=d,
                     max_position_embeddings=orig * 4,
                     rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": factor,
                                      "original_max_position_embeddings": orig})  # fmt: skip
    inv, attn_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, torch.device("cpu"))
    meta = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": factor,
            "llama.rope.scaling.original_context_length": orig}  # fmt: skip
    rs = read_scaling(Keys(meta, "llama"), 4 * orig)
    ours = ScaledRope(d, base, 2048, None, rs)
    pos = torch.arange(2048, dtype=torch.float64)
    ang = torch.outer(pos, inv.double())  # [P, D/2]; float32 angles to 2047: ~2e-4 apart
    assert torch.allclose(ours._cos.double(), ang.cos() * attn_factor, atol=5e-4)
    assert torch.allclose(ours._sin.double(), ang.sin() * attn_factor, atol=5e-4)
    plain = Rope(d, base, 2048)
    assert (ours._cos - plain._cos).abs().max() > 0.1, "the scaling changes nothing: no test"


def test_deepseek2_yarn_softmax_scale_equals_transformers() -> None:
    import json

    from transformers import DeepseekV2Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention

    spec = json.loads((DATA / "deepseek2.json").read_text())["variants"]["moe"]
    meta = typed_metadata(spec["metadata"])
    factor, mscale_all = 40.0, 0.707
    key = "deepseek2.rope.scaling."
    meta |= {key + "type": "yarn", key + "factor": factor,
             key + "original_context_length": np.uint32(64),
             key + "yarn_log_multiplier": np.float32(0.1 * mscale_all)}  # fmt: skip
    cfg = ModelConfig.from_gguf({k: v.item() if isinstance(v, np.generic) else v
                                 for k, v in meta.items()})  # fmt: skip
    hf = DeepseekV2Config(hidden_size=128, num_attention_heads=1, num_key_value_heads=1,
                          kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                          qk_nope_head_dim=128, v_head_dim=128,
                          rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                           "factor": factor, "mscale": mscale_all,
                                           "mscale_all_dim": mscale_all,
                                           "original_max_position_embeddings": 64})  # fmt: skip
    want = DeepseekV2Attention(hf, 0).scaling
    assert cfg.attn_scale == pytest.approx(want, rel=1e-6)
    assert cfg.attn_scale > 1.2 / math.sqrt(192), "no mscale: no test"
    # the rope's own magnitude cancels to 1 (mscale == mscale_all_dim), as transformers'
    _, attn_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, torch.device("cpu"))
    rope = ScaledRope(64, 10000.0, 16, None, cfg.rope_scaling)
    assert torch.allclose(rope._cos**2 + rope._sin**2, torch.full((16, 32), attn_factor**2))


@pytest.mark.parametrize("pairs", [False, True])
def test_partial_rope_rotates_the_first_dims_only(pairs: bool) -> None:
    g = torch.Generator().manual_seed(3)
    t, h, d, n_rot, base = 5, 3, 32, 12, 10000.0
    x = torch.randn(t, h, d, generator=g)
    cos, sin = Rope(n_rot, base, 16).tables(torch.arange(t))
    got = partial_rope(x, cos, sin, n_rot, pairs)
    assert torch.equal(got[:, :, n_rot:], x[:, :, n_rot:])
    # llama.cpp's rope from its definition: pair i (dims 2i, 2i+1 for "norm", i and
    # i + n_rot/2 for "neox") turned by pos * base^(-2i / n_rot)
    want = x.double().clone()
    for i in range(n_rot // 2):
        a, b = (2 * i, 2 * i + 1) if pairs else (i, i + n_rot // 2)
        ang = torch.arange(t, dtype=torch.float64) * base ** (-2 * i / n_rot)
        c, s = ang.cos()[:, None], ang.sin()[:, None]
        want[:, :, a] = x[:, :, a] * c - x[:, :, b] * s
        want[:, :, b] = x[:, :, a] * s + x[:, :, b] * c
    assert torch.allclose(got.double(), want, atol=1e-5)
