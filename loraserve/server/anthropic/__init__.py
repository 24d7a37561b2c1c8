"""The Anthropic Messages API: `/v1/messages` and its token count, converted to a chat request."""
