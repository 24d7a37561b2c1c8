"""Where a decoder's weights come from, and in which precision it runs them.

`WeightSource` hands the decoder each tensor by its GGUF name: small vectors (norms, biases,
routers) as float32, matrices as a `Matrix` in the form the precision asks for. The
precision is declared once, at load:

- ``native`` (the default): matrices keep the file's own values and bit widths (a GGUF
  file's quantized rows, memory-mapped, or repacked once 8 rows to a group where the type
  has a packed kernel; a Hugging Face folder's float tensors) and run on the
  row-independent kernels of `loraserve.kernels`; embedding rows are dequantized on lookup.
- ``float32``: every matrix dequantized to float32 once, the exact reference path (the
  transformers parity tests run it).
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch

from loraserve.kernels import pack_rows
from loraserve.kernels.hugebuf import empty_u8
from loraserve.kernels.pack import packed_width
from loraserve.model.config import ModelConfig
from loraserve.model.gguf import GGUFFile
from loraserve.model.hf import HFCheckpoint
from loraserve.model.projection import Matrix

Precision = Literal["native", "float32"]
PRECISIONS: tuple[str, ...] = ("native", "float32")
PACK_CHUNK = 16 << 20  # bytes of a large matrix's file rows packed (and released) at a time


class WeightSource:
    """Tensors of a GGUF file or a Hugging Face folder under GGUF names."""

    def __init__(self, opened: GGUFFile | HFCheckpoint, cfg: ModelConfig, precision: Precision):
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose one of {PRECISIONS}")
        self.cfg, self.precision = cfg, precision
        self._gg = opened if isinstance(opened, GGUFFile) else None
        self._hf = opened if isinstance(opened, HFCheckpoint) else None

    def has(self, name: str) -> bool:
        if self._gg is not None:
            return name in self._gg.tensors
        return name in self._hf.names()  # type: ignore[union-attr]

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape (torch order), without reading its values from a GGUF file."""
        if self._gg is not None:
            return tuple(self._gg.tensors[name].shape)
        t = self._hf.tensor(name)  # type: ignore[union-attr]
        assert t is not None
        return tuple(t.shape)

    def float(self, name: str) -> torch.Tensor | None:
        """The tensor as float32 (dequantized), or None if the model lacks it."""
        if not self.has(name):
            return None
        if self._gg is not None:
            t = self._gg.tensor(name)
        else:
            t = self._hf.tensor(name)  # type: ignore[union-attr]
        return self._unpermute(name, t)

    def raw(self, name: str) -> tuple[torch.Tensor, int, tuple[int, ...]]:
        """A GGUF tensor's bytes as a uint8 tensor (sharing the mapping), type and shape."""
        info = self._gg.tensors[name]  # type: ignore[union-attr]
        with warnings.catch_warnings():  # read-only mapping; the bytes are only ever read
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(self._gg.raw(name))  # type: ignore[union-attr]
        return raw, info.ggml_type, info.shape

    def matrix(self, name: str, label: str | None = None) -> Matrix | None:
        """A 2-D weight in this precision's form (``label``: its name as a LoRA target)."""
        if not self.has(name):
            return None
        label = label or name
        if self._hf is not None and self.precision == "native":  # the folder's own dtype
            t = self._hf.tensor(name, stored=True)
            assert t is not None
            return Matrix.from_float(label, t.reshape(t.shape[0], -1))
        if self._gg is None or self.precision == "float32":
            t = self.float(name)
            assert t is not None
            return Matrix.from_float(label, t.reshape(t.shape[0], -1))
        raw, gtype, shape = self.raw(name)
        m = Matrix.from_raw(label, raw, gtype, (shape[0], shape[-1]))
        if self._permuted(name):
            heads = self.cfg.n_heads if ".attn_q." in name else self.cfg.n_kv_heads
            m = m.rows(unpermute_qk(torch.arange(shape[0]), heads))
        if m.data.data_ptr() == raw.data_ptr() and m.nbytes() > PACK_CHUNK:
            return self._pack_in_blocks(name, m)
        packed = m.pack()
        if packed is not m:  # the copy serves now: the mapping's pages need not stay
            self._gg.release(name)  # type: ignore[union-attr]
        return packed

    def _pack_in_blocks(self, name: str, m: Matrix) -> Matrix:
        """A large mapped matrix (an output matrix) packed a block of rows at a time, each
        block's mapped pages released once its copy is made: the file's pages and the
        packed copy are never both resident whole (a 587 MiB Q8_0 output matrix raised
        the peak RSS by as much). The same bytes as packing it whole (groups of 8 rows)."""
        n, rb = m.shape[0], m.data.shape[1]
        rows = max(PACK_CHUNK // rb // 8 * 8, 8)
        width = None if n % 8 else packed_width(m.ggml_type, m.shape[1], n)
        if width is None:  # no packed kernel for this type or row count: the file's rows
            return m
        out = empty_u8(n, width)  # [N, group bytes / 8] (`hugebuf`)
        for lo in range(0, n, rows):
            hi = min(lo + rows, n)
            # each block packed in place (no block-sized copy to make, fault in and free)
            done = pack_rows(m.data[lo:hi], m.ggml_type, m.shape[1], out=out[lo:hi])
            assert done is not None  # the same type, whole groups of 8 rows
            self._gg.release(name, lo * rb, hi * rb)  # type: ignore[union-attr]
        return Matrix(m.name, out, m.ggml_type, m.shape, True, rb)

    def release(self, name: str) -> None:
        """Drop the mapping's resident pages of a GGUF tensor whose values a copy now serves
        (experts repacked at load); a later read maps them in again."""
        if self._gg is not None:
            self._gg.release(name)

    def experts(self, name: str) -> list[Matrix] | None:
        """A stacked expert tensor [E, n_out, n_in] as one Matrix per expert."""
        if not self.has(name):
            return None
        if self._gg is None or self.precision == "float32":
            t = self.float(name)
            assert t is not None
            return [Matrix.from_float(name, t[e]) for e in range(t.shape[0])]
        raw, gtype, shape = self.raw(name)
        per = raw.reshape(shape[0], -1)  # [E, bytes per expert]
        return [Matrix.from_raw(name, per[e], gtype, (shape[1], shape[2])) for e in range(shape[0])]

    def embedding_rows(self) -> tuple[torch.Tensor, int] | None:
        """GGUF token embedding rows [V, row_bytes] and type, for lookup without a float
        table (native precision only)."""
        if self._gg is None or self.precision == "float32":
            return None
        raw, gtype, shape = self.raw("token_embd.weight")
        return raw.reshape(shape[0], -1), gtype

    def _permuted(self, name: str) -> bool:
        return (
            self._gg is not None
            and self.cfg.permuted_qk
            and name.endswith((".attn_q.weight", ".attn_k.weight", ".attn_q.bias", ".attn_k.bias"))
        )

    def _unpermute(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if not self._permuted(name):
            return t
        heads = self.cfg.n_heads if ".attn_q." in name else self.cfg.n_kv_heads
        return unpermute_qk(t, heads)


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter permutation of llama q/k rows (back to HF layout).

    The converter stores rows as interleaved rope pairs; HF (and this decoder) rotate
    halves. w: [n_heads * head_dim, ...] (a row index vector works too).
    """
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's converter permutation (HF layout -> GGUF layout), for writers and tests."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
