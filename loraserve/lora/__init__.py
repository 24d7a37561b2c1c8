"""LoRA adapters: loading (GGUF, PEFT), identity, batched application, merging."""
