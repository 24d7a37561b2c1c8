"""Tests of `loraserve ray` on a local Ray cluster (skipped without Ray Serve)."""
