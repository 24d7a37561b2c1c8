"""Where a decode step of an `bench.arch_speed` model spends its time, per stage.

`python -m bench.arch_profile ARCH [--layers N] [--threads 1] [--tokens 16] [--reps 2]
[--paths]` loads the `bench.synth_archs` model in-process and runs `bench.stage_profile`'s
decode profile: per decode token, the thread-CPU time in each quantized projection (by
tensor name), the attention kernel, the norms, rope, the gated activation, the layers as a
whole (the per-layer path) or the fused C layers (`kernels.layers`) as one stage, and the
output. It also says whether the model takes the fused decode call (`model/fused.py`) and,
if not, which of `build_fused`'s conditions keeps it on the per-layer path. `--paths`
alternates the fused and the per-layer path (where the fused one exists). Thread CPU time:
compare runs at 1 thread; not a figure against llama-server (that is `bench.arch_speed`).
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.arch_shapes import SHAPES
from bench.stage_profile import Meter, Rows, decode_profile, print_rows, wrap_projections
from bench.synth_archs import synth_model


def why_not_fused(cfg: Any) -> list[str]:
    """The model-wide reasons `build_fused` returns None for `cfg` (empty: none of them)."""
    checks = {
        "q/k norm over all heads (qk_norm_mode != head)": cfg.qk_norm_mode != "head",
        "no pre-norms": not cfg.pre_norms, "attention temperature": bool(cfg.attn_temp),
        "attention soft-capping": bool(cfg.attn_softcap), "sinks": bool(cfg.attn_sinks),
        "latent attention": bool(cfg.kv_lora_rank), f"norm {cfg.norm!r}": cfg.norm != "rms",
        "parallel attention/FFN": bool(cfg.parallel), "chunked attention": bool(cfg.attn_chunk),
        "q/k L2 norm": bool(cfg.qk_l2_norm),
        f"activation {cfg.act!r}": cfg.act not in ("silu", "gelu_tanh", "relu_sqr"),
    }  # fmt: skip
    return [k for k, v in checks.items() if v]


def instrument(decoder: Any, meter: Meter) -> None:
    """Wrap the projections, the fused layers, and block.py's attention, norms, rope, act."""
    from loraserve.kernels.layers import FusedLayers
    from loraserve.model import block

    wrap_projections(decoder, meter)
    FusedLayers.__call__ = meter.wrap(  # type: ignore[method-assign]
        FusedLayers.__call__, "fused layers (C)"
    )
    stages = (("paged_attention", "attention"), ("rms_norm", "rms_norm"),
              ("layer_norm", "layer_norm"), ("apply_rope", "rope"),
              ("partial_rope", "rope (partial)"), ("gated_act", "gated act"))  # fmt: skip
    for name, label in stages:
        if hasattr(block, name):
            setattr(block, name, meter.wrap(getattr(block, name), label))
    for blk in decoder.blocks:
        blk.forward = meter.wrap(blk.forward, "layers (all, per-layer path)")


def profile(arch: str, layers: int, threads: int, tokens: int, reps: int = 2,
            paths: bool = False) -> tuple[Any, list[tuple[str, Rows]]]:  # fmt: skip
    """The config and, per repetition, its path and rows (label, s per decode token, calls)."""
    from loraserve.model.loader import load_model

    m = load_model(synth_model(arch, layers))
    fused = m.decoder._fused() is not None
    meter = Meter()
    instrument(m.decoder, meter)
    out = []
    for r in range(reps if paths and fused else 1):
        m.decoder.use_fused = fused and not (paths and r % 2)
        label = "fused" if m.decoder.use_fused else "per-layer"
        n = 1 if paths and fused else reps
        out += [(label, rows) for rows in decode_profile(m, meter, threads, tokens, 4096, n)]
    m.decoder.use_fused = True
    return m.decoder.cfg, out


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.arch_profile ARCH [--layers N] [--threads N] [--tokens N]`."""
    ap = argparse.ArgumentParser(prog="python -m bench.arch_profile", description=__doc__)
    ap.add_argument("arch", choices=list(SHAPES))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--paths", action="store_true", help="fused and per-layer paths in turn")
    args = ap.parse_args(argv)
    cfg, runs = profile(args.arch, args.layers, args.threads, args.tokens, args.reps, args.paths)
    why = why_not_fused(cfg)
    print(f"{args.arch}: fused decode call: " + ("model-wide blockers: " + "; ".join(why)
                                                 if why else "no model-wide blocker"))  # fmt: skip
    for label, rows in runs:
        print_rows(f"{args.arch} ({label})", [rows], width=36)


if __name__ == "__main__":
    main()
