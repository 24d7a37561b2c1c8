"""The chat layer: messages to a prompt (Jinja templates as llama.cpp's engine renders them, and
llama.cpp's built-in templates) and generated text back to a message (reasoning, content, tool
calls). Used by the server's API surfaces; knows nothing of HTTP routes."""
