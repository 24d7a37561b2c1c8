"""Per-row variants of the paged attention's q/k preparation: a partial rope (the first
``rope_dim`` dims of each head rotated, as GLM-4, MiniMax-M2 and Phi-4-mini files have it) and
the attention temperature of llama4's no-rope layers and of every mistral3 layer (after rope).

Both are elementwise: a row's bits depend on that row alone, whatever the batch.
"""

from __future__ import annotations

import torch


def partial_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_rot: int, pairs: bool
) -> torch.Tensor:
    """x [T, H, D] with its first ``n_rot`` dims of each head rotated by cos/sin [T, n_rot/2]
    (llama.cpp's ``ggml_rope_ext`` with n_dims < D): ``pairs`` rotates adjacent dims
    (2i, 2i+1) (rope "norm", the GGUF rows as stored), else dims (i, i + n_rot/2) ("neox");
    dims n_rot.. pass unchanged."""
    half = n_rot // 2
    out = x.clone()
    if pairs:
        x0, x1 = x[:, :, 0:n_rot:2], x[:, :, 1:n_rot:2]  # [T, H, n_rot/2]
    else:
        x0, x1 = x[:, :, :half], x[:, :, half:n_rot]
    c, s = cos[:, None, :], sin[:, None, :]  # [T, 1, n_rot/2]
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    if pairs:
        out[:, :, 0:n_rot:2], out[:, :, 1:n_rot:2] = y0, y1
    else:
        out[:, :, :half], out[:, :, half:n_rot] = y0, y1
    return out


def temperature(positions: torch.Tensor, temp: tuple[float, ...]) -> torch.Tensor:
    """The attention temperature (llama4, mistral3) per row [T, 1, 1] float32 for positions [T]:
    ``log(floor((pos + offset) / floor_scale) + 1) * scale + 1``, computed in double then
    rounded to float32 as llama.cpp's ``llm_graph_input_attn_temp`` does."""
    floor_scale, scale, offset = temp
    scale = float(torch.tensor(scale, dtype=torch.float32))  # a float constant, widened
    p = positions.to(torch.float64)
    t = torch.log(torch.floor((p + offset) / floor_scale) + 1.0) * scale + 1.0
    return t.to(torch.float32).view(-1, 1, 1)
