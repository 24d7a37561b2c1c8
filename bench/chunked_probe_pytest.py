"""A pytest plugin: a test session with the row-block probe scans in place of the engine's.

`bench.chunked_probe_install` swaps them in; `python -m pytest -p bench.chunked_probe_pytest
tests/unit/model/test_hybrid_snapshots.py ...` runs the project's own bit-identity tests
(alone, batched, chunked, cache on and off, snapshots, drafts) on them, and reports at the
end how many scan calls the probe took and how many went to the original kernels."""

from __future__ import annotations

from typing import Any


def pytest_configure(config: Any) -> None:
    """Swap the probe in before any test module is imported."""
    from bench.chunked_probe_install import install

    install()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The probe's share of the scan calls."""
    from bench.chunked_probe_install import CALLS

    terminalreporter.write_line(f"chunked_probe_pytest: scan calls {CALLS}")
