"""Side-by-side benchmark of loraserve against llama.cpp's llama-server (see README.md)."""
