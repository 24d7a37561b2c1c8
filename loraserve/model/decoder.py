"""The generic decoder: one class for every architecture in `archs/`.

Weights come from a `WeightSource` under GGUF names (q/k rows of "norm"-rope architectures
already un-permuted to Hugging Face layout), matrices in the precision declared at load.
Architecture differences are fields of `ModelConfig`: flags, and which layer kind (`attn/`,
`ffn/`, `recurrent/`) sits at which depth; one layer is a `block.Block`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from loraserve.kernels.layers import FusedLayers
from loraserve.kernels.rowops import softcap_
from loraserve.model.attn.rope_scaling import RopeScaling, ScaledRope
from loraserve.model.block import Block, norm
from loraserve.model.block import f32 as _f32
from loraserve.model.block import matrix as _matrix
from loraserve.model.block import req as _req
from loraserve.model.config import ModelConfig
from loraserve.model.context import get_context
from loraserve.model.fused import build_fused
from loraserve.model.layers import Rope, RowEmbedding
from loraserve.model.projection import Matrix, Projection
from loraserve.model.recurrent.records import decode_records
from loraserve.model.weights import WeightSource

__all__ = ["Block", "Decoder", "norm"]


class Decoder(nn.Module):
    """Token ids and positions of a flat batch -> logits of the rows the step asks for."""

    def __init__(self, cfg: ModelConfig, w: WeightSource) -> None:
        super().__init__()
        self.cfg = cfg
        rows = w.embedding_rows()
        if rows is not None:  # rows dequantized on lookup: no float copy of the vocabulary
            self.embed: torch.Tensor | RowEmbedding = RowEmbedding(
                rows[0], rows[1], cfg.hidden_size
            )
        else:
            self.embed = _req(w, "token_embd.weight")  # [V, hidden] float32
        self.blocks = nn.ModuleList(Block(cfg, i, w) for i in range(cfg.n_layers))
        out_norm = cfg.tensor("output_norm")  # lfm2: token_embd_norm
        self.norm = _req(w, out_norm + ".weight").float()
        self.norm_b = _f32(w.float(out_norm + ".bias"))  # LayerNorm bias (starcoder2)
        if not cfg.tied_output:
            out = _matrix(w, "output.weight")
        elif isinstance(self.embed, torch.Tensor):
            out = Matrix.from_float("output.weight", self.embed)
        else:
            out = _matrix(w, "token_embd.weight", "output.weight")
            if out.packed and out.ggml_type == self.embed.ggml_type:
                self.embed.read_packed(out.data)  # the table's pages stay unmapped
        self.output = Projection("output.weight", [out])
        # steps run every layer in one C call (`kernels.layers`), LoRA included, same bits
        self.use_fused = True
        self._fused_built: list[FusedLayers | None] = []
        # frequency factors: rope_freqs (llama 3, llama4), else phi3's short ones, or its long
        # ones for a context past the trained one (`for_context`)
        rf = cfg.tensor("rope_freqs")  # "": the file's rope_freqs is unused (falcon-h1)
        self._factors = w.float(rf + ".weight") if rf else None
        self._factors_long = None
        if self._factors is None:
            self._factors = w.float("rope_factors_short.weight")
            self._factors_long = w.float("rope_factors_long.weight")
        self._build_rope(self._factors)
        # no layer rotates (granitehybrid): a step's tables are zeros of their shape, never
        # read (`_unused_tables`), not looked up position by position
        self._any_rope = any(b.rope for b in self.blocks)
        self._unused: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._embed_scale = torch.tensor(cfg.embed_scale, dtype=torch.float32)
        self._mixers = [b.mixer for b in self.blocks]
        self._by_long: dict[bool, Decoder] = {False: self}  # `for_context`: shared by siblings

    def _build_rope(self, factors: torch.Tensor | None) -> None:
        cfg = self.cfg
        n = min(cfg.context_length, 8192)
        rd = cfg.rope_dim or cfg.head_dim  # latent attention rotates its rope part only
        rs = cfg.rope_scaling
        local = rs if cfg.local_rope_scaled else rs.unscaled()
        self.rope_global = _rope(rd, cfg.rope_theta, n, factors, rs)
        self.rope_local = (
            _rope(rd, cfg.rope_theta_local, n, factors, local)
            if cfg.rope_theta_local != cfg.rope_theta or local != rs
            else self.rope_global
        )

    def for_context(self, n_ctx_seq: int) -> Decoder:
        """This decoder for sequences of ``n_ctx_seq`` positions. Past the trained context
        (``rope.scaling.original_context_length``), phi3's long rope factors replace the short
        ones, as llama.cpp's ``get_rope_factors`` chooses them for the whole context. The
        choice belongs to the decoder returned: a sibling that shares every layer and weight
        and has its own rope tables, so engines of different contexts over one loaded model
        (router presets) never change each other's; this decoder keeps its own factors."""
        if self._factors_long is None:
            return self
        long = n_ctx_seq > (self.cfg.rope_scaling.ctx_orig or self.cfg.context_length)
        sib = self._by_long.get(long)
        if sib is None:
            sib = copy.copy(self)  # shallow: the same blocks, embedding and output
            sib._modules = dict(self._modules)  # its own entries for the rope modules
            sib._parameters, sib._buffers = dict(self._parameters), dict(self._buffers)
            sib._build_rope(self._factors_long if long else self._factors)
            self._by_long[long] = sib
        return sib

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [T] long -> logits [S, V] float32 for ctx.logits_rows."""
        ctx = get_context()
        if isinstance(self.embed, torch.Tensor):
            x = self.embed[input_ids]  # [T, hidden]
        else:
            x = self.embed(input_ids)
        if self.cfg.embed_scale != 1.0:
            x = x * self._embed_scale
        temp = self.cfg.attn_temp
        max_pos = int(positions.max()) if self._any_rope or temp else 0
        if self._any_rope:
            self.rope_global.ensure(max_pos)
            rope_global = self.rope_global.tables(positions)
            if self.rope_local is self.rope_global:  # one base (most models): the same tables
                rope_local = rope_global
            else:
                self.rope_local.ensure(max_pos)
                rope_local = self.rope_local.tables(positions)
        else:
            rope_global = rope_local = self._unused_tables(x.shape[0])
        fused = self._fused() if self.use_fused else None
        if fused is not None and temp and max_pos + temp[2] >= temp[0]:
            fused = None  # the fused layers leave out a temperature that is 1 below f - o
        kv = ctx.kv_caches
        lora_in = None
        if fused is not None and ctx.lora is not None:  # deltas in the same call, if it can
            get = getattr(ctx.lora, "fused_inputs", None)
            lora_in = None if get is None else get(fused, x.shape[0])
            if lora_in is None:
                fused = None
        states = None
        if fused is not None and fused.mamba_layers:  # Mamba-2 layers: decode steps alone
            states = decode_records(self._mixers, ctx.states, x.shape[0])  # type: ignore[arg-type]
            fused = None if states is None else fused
        if fused is not None and all(k.dtype == v.dtype == torch.float32 for k, v in kv):
            a = ctx.attn  # every layer in one C call: the same kernels, the same bits
            x = fused(x.contiguous(), ctx.slot_mapping, a.slots, a.seq_off, a.row_seq,
                      a.row_nkeys, a.window, rope_global, rope_local, kv, lora_in,
                      states)  # fmt: skip
        else:
            none = None
            for blk in self.blocks:
                if not blk.rope:  # identity tables: x * 1 - y * 0 is x, bit for bit
                    if none is None:
                        c = rope_global[0]
                        none = (torch.ones_like(c), torch.zeros_like(c))
                    x = blk(x, none)
                else:
                    x = blk(x, rope_local if blk.local_rope else rope_global)
        cfg = self.cfg
        if ctx.hidden_rows is not None:  # embeddings hook: see StepContext.hidden_rows
            ctx.hidden = norm(cfg, x.index_select(0, ctx.hidden_rows), self.norm, self.norm_b)
        if ctx.logits_rows.numel() != x.shape[0]:  # else every row: the runner's rows ascend
            x = x.index_select(0, ctx.logits_rows)
        x = norm(cfg, x, self.norm, self.norm_b)
        logits = self.output(x)  # [S, V]
        if cfg.final_softcap > 0.0:
            softcap_(logits, cfg.final_softcap)
        if cfg.logit_scale != 1.0:  # one multiply per value: the same bits anywhere
            logits.mul_(cfg.logit_scale)
        return logits

    def _unused_tables(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rope tables of ``t`` rows ([t, D/2] zeros) for a model none of whose layers
        rotates: only their shape is read."""
        tables = self._unused.get(t)
        if tables is None:
            z = torch.zeros(t, self.rope_global.inv_freq.shape[0])
            tables = self._unused[t] = (z, z)
        return tables

    def _fused(self) -> FusedLayers | None:
        """The fused layers, built on first use; None where a layer needs the Python path
        (MoE, float weights) or the C kernels are not here."""
        if not self._fused_built:
            self._fused_built.append(build_fused(self.cfg, self.blocks))
        return self._fused_built[0]


def _rope(dim: int, theta: float, n: int, factors: torch.Tensor | None,
          scaling: RopeScaling) -> Rope:  # fmt: skip
    """The rope tables of one base: plain, or scaled as the file says."""
    if scaling.identity:
        return Rope(dim, theta, n, factors)
    return ScaledRope(dim, theta, n, factors, scaling)
