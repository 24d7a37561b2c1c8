"""The HTTP server: llama-server and OpenAI compatible endpoints."""
