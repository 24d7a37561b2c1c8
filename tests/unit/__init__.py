"""Unit tests, CPU only, on tiny models built in the tests: one folder per package."""
