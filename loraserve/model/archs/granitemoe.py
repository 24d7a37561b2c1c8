"""granitemoe (llama.cpp src/models/granite-moe.cpp): granite's multipliers and rope with
softmax-routed experts on every layer (shared experts added where the file has them)."""

from loraserve.model.archs.base import Arch
from loraserve.model.archs.granite import multipliers

ARCH = Arch(name="granitemoe", hf_types=("granitemoe",), rope="norm", experts="optional",
            gguf=multipliers)  # fmt: skip
