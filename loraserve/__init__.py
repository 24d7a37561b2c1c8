"""loraserve: a llama-server compatible inference server built for multi-LoRA serving."""

__version__ = "0.1.0"
