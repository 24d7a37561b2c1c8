"""llama-server's own API: `/completion`, its result objects, `/tokenize`, `/detokenize`,
`/apply-template`, embeddings and reranking, `/slots`, `/lora-adapters`, `/metrics`, `/props`,
`/health`."""
