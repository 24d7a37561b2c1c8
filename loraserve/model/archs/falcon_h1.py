"""falcon-h1 (llama.cpp src/models/falcon-h1.cpp): every layer runs attention (rope on halves,
q/k/v biases where the file has them, no output bias in the graph) and a Mamba-2 mixer
(`recurrent.Mamba2`, its grouped norm where the file has one) side by side on the same normed
input, their outputs summed into the residual (layer kind "attn+mamba2"); then a SiLU-gated FFN
with its biases after ``ffn_norm`` (stored without a ``.weight`` suffix). The µP multipliers
are folded into the weights by llama.cpp's converter; a ``rope_freqs`` in the file is
not applied (the graph ropes without frequency factors)."""

from typing import Any

from loraserve.model.archs.base import Arch, Keys


def ssm_sizes(keys: Keys, groups: bool = True) -> tuple[int, ...]:
    """(d_conv, d_inner, d_state, heads or dt rank, groups) from ``<arch>.ssm.*``."""
    names = ("conv_kernel", "inner_size", "state_size", "time_step_rank")
    g = int(keys.req("ssm.group_count")) if groups else 1
    return (*(int(keys.req(f"ssm.{k}")) for k in names), g)


def _gguf(keys: Keys, n_layers: int) -> dict[str, Any]:
    return dict(
        layer_kinds=("attn+mamba2",) * n_layers,
        ssm=ssm_sizes(keys),
        tensor_names=(("rope_freqs", ""),),  # the file may hold one; the graph never reads it
    )


ARCH = Arch(name="falcon-h1", rope="neox", unused_biases=("attn_output",), recurrent=True,
            gguf=_gguf)  # fmt: skip
