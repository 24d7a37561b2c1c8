"""Other servers' adapter APIs, for users who migrate: vLLM's (`vllm`) and SGLang's
(`sglang`) load and unload endpoints, each with its own field names and error shapes, on
the same engine calls and rules as loraserve's own (`native/lora_api`: paths only under
`--lora-dir`, the API key)."""
