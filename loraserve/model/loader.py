"""Load a model (GGUF file or Hugging Face folder) into a `Decoder` plus its tokenizer."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loraserve.model.config import ModelConfig
from loraserve.model.decoder import Decoder
from loraserve.model.layers import RowEmbedding
from loraserve.model.prepared import load_prepared, prepared_cache_file, save_prepared
from loraserve.model.tokenizer import Tokenizer

log = logging.getLogger("loraserve.model")


@dataclass
class LoadedModel:
    """A ready decoder with everything the engine and server need to know about it."""

    path: Path
    config: ModelConfig
    decoder: Decoder
    tokenizer: Tokenizer
    metadata: dict[str, Any]  # GGUF metadata (empty for HF folders)
    dtype: torch.dtype
    name: str


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter permutation of llama q/k rows (back to HF layout).

    The converter stores rows as interleaved rope pairs; HF (and this decoder) rotate
    halves. w: [n_heads * head_dim, in].
    """
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's converter permutation (HF layout -> GGUF layout), for writers and tests."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, int8: bool = False
) -> LoadedModel:
    """Read a GGUF file or HF folder and build the decoder.

    ``int8`` keeps projection weights as int8 with per-row scales (faster decode);
    ``dtype`` is the activation/compute dtype.
    """
    path = Path(path)
    t0 = time.perf_counter()
    if path.is_dir():
        from loraserve.model.hf import HFCheckpoint

        ckpt = HFCheckpoint(path)
        cfg, meta = ckpt.config, {}
        tok = Tokenizer.from_hf_dir(path)
        weight_fn = ckpt.tensor
        name = path.name
    else:
        from loraserve.model.gguf import GGUFFile

        gg = GGUFFile(path)
        meta = gg.metadata
        cfg = ModelConfig.from_gguf(meta, set(gg.tensors))
        if "token_embd.weight" in gg.tensors:
            vocab = gg.tensors["token_embd.weight"].shape[0]
            if vocab != cfg.vocab_size:
                cfg = _replace(cfg, vocab_size=vocab)
        tok = Tokenizer.from_gguf_metadata(meta)
        name = str(meta.get("general.name") or path.stem)

        def weight_fn(n: str) -> torch.Tensor | None:
            if n not in gg.tensors:
                return None
            t = gg.tensor(n)
            if cfg.arch == "llama" and n.endswith((".attn_q.weight", ".attn_k.weight")):
                heads = cfg.n_heads if ".attn_q." in n else cfg.n_kv_heads
                t = unpermute_qk(t, heads)
            return t

    t1 = time.perf_counter()
    prepared: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    embedding = None
    cache_file = None
    if int8 and not path.is_dir():
        info = gg.tensors.get("token_embd.weight")
        if info is not None:
            with warnings.catch_warnings():  # read-only mmap; the rows are only read
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.from_numpy(gg.raw("token_embd.weight").reshape(info.shape[0], -1))
            embedding = RowEmbedding(raw, info.ggml_type, info.shape[1])
        cache_file = prepared_cache_file(path)
        prepared = load_prepared(cache_file) if cache_file is not None else {}
    decoder = Decoder(
        cfg, weight_fn, dtype=dtype, int8=int8, prepared=prepared, embedding=embedding
    )
    if cache_file is not None and not prepared:
        save_prepared(cache_file, decoder, str(path.resolve()))
    decoder.output.drop_int8_source()
    log.info(
        "loaded %s (%s, %d layers, %s%s) in %.2f s (metadata+tokenizer %.2f s)",
        name,
        cfg.arch,
        cfg.n_layers,
        str(dtype).removeprefix("torch."),
        ", int8 weights" if int8 else "",
        time.perf_counter() - t0,
        t1 - t0,
    )
    return LoadedModel(path, cfg, decoder, tok, meta, dtype, name)


def _replace(cfg: ModelConfig, **kw: Any) -> ModelConfig:
    from dataclasses import replace

    return replace(cfg, **kw)
