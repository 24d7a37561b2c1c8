"""Token sampling with llama-server's semantics: the chain (`chain`), a request's settings
(`params`) and per-request state (`state`), and the row-wise ops it runs on (`ops`)."""
