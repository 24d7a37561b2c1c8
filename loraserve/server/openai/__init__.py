"""The OpenAI-compatible API: `/v1/completions`, `/v1/chat/completions`, `/v1/models`, the
Responses API and the input-token counts."""
