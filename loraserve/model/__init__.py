"""Model formats (GGUF, Hugging Face), tokenizer, config and the generic decoder."""
