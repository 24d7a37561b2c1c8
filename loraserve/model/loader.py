"""Load a model (GGUF file or Hugging Face folder) into a `Decoder` plus its tokenizer."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loraserve import cbuild as build
from loraserve import kernels
from loraserve.model.config import ModelConfig
from loraserve.model.decoder import Decoder
from loraserve.model.tokenizer import Tokenizer
from loraserve.model.validate import ModelFileError, gguf_config
from loraserve.model.weights import Precision, WeightSource, permute_qk, unpermute_qk

__all__ = ["LoadedModel", "load_model", "permute_qk", "unpermute_qk"]

log = logging.getLogger("loraserve.model")


@dataclass
class LoadedModel:
    """A ready decoder with everything the engine and server need to know about it."""

    path: Path
    config: ModelConfig
    decoder: Decoder
    tokenizer: Tokenizer
    metadata: dict[str, Any]  # GGUF metadata (empty for HF folders)
    precision: Precision
    name: str


def load_model(
    path: str | Path, precision: Precision = "native", scan_chunk: int = 0
) -> LoadedModel:
    """Read a GGUF file or HF folder and build the decoder in ``precision``
    (`loraserve.model.weights`: ``native`` keeps the file's formats, ``float32`` is the
    exact dequantized reference); ``scan_chunk`` > 0 runs delta-net and Mamba-2 scans in
    chunks of that many positions (`model.recurrent.chunked`)."""
    path = Path(path)
    t0 = time.perf_counter()
    # a cold first start compiles the C kernels (in parallel) while the file is parsed
    build.prebuild()
    if path.is_dir():
        from loraserve.model.hf import HFCheckpoint

        ckpt = opened = HFCheckpoint(path)
        cfg, meta = ckpt.config, {}
        tok = Tokenizer.from_hf_dir(path)
        name = path.name
    else:
        from loraserve.model.gguf import GGUFFile

        gg = opened = GGUFFile(path)
        meta = gg.metadata
        # every hyper-parameter and tensor shape checked before a layer is built
        cfg = gguf_config(path, meta, gg.tensors)
        try:
            tok = Tokenizer.from_gguf_metadata(meta)
        except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as e:
            raise ModelFileError(f"{path}: unusable tokenizer: {e}") from None
        name = str(meta.get("general.name") or path.stem)
    if scan_chunk:
        cfg = replace(cfg, scan_chunk=scan_chunk)
    t1 = time.perf_counter()
    decoder = Decoder(cfg, WeightSource(opened, cfg, precision))
    # build (first start) or load the C kernels now, not on the first request
    from loraserve.kernels import attention, floatmm, rowops

    attention.backend()
    rowops._c()
    floatmm.backend()
    log.info(
        "loaded %s (%s, %d layers, %s weights, %s kernels) in %.2f s (metadata+tokenizer %.2f s)",
        name,
        cfg.arch,
        cfg.n_layers,
        "file-native" if precision == "native" else "float32",
        kernels.backend(),
        time.perf_counter() - t0,
        t1 - t0,
    )
    return LoadedModel(path, cfg, decoder, tok, meta, precision, name)
