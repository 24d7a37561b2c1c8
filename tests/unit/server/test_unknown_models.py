"""Unknown `model` names are counted, not stored (issue 31 item 10): the once-per-name
warning remembers a bounded number of names, however many distinct names clients send."""

from __future__ import annotations

import logging

import pytest

from loraserve.server.config.args import parse_server_args
from loraserve.server.state import WARNED_MODELS_MAX, ServerState


def test_distinct_names_do_not_grow_the_memory(caplog: pytest.LogCaptureFixture) -> None:
    state = ServerState(parse_server_args([]))
    with caplog.at_level(logging.WARNING, logger="loraserve.server"):
        for i in range(10_000):
            state.warn_unknown_model(f"name-{i}")
            assert state.warned_model_names <= WARNED_MODELS_MAX
        huge = "x" * 3_000_000
        state.warn_unknown_model(huge)
        state.warn_unknown_model(huge)
    assert state.unknown_model_requests == 10_002
    assert state.warned_model_names == WARNED_MODELS_MAX
    assert len(caplog.records) == 10_001  # each new name once; the repeat is not logged
    assert max(len(r.getMessage()) for r in caplog.records) < 1_000  # a long name is cut


def test_recent_name_warned_once() -> None:
    state = ServerState(parse_server_args([]))
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("loraserve.server")
    logger.addHandler(handler)
    try:
        for _ in range(3):
            state.warn_unknown_model("gpt-4o")
        for i in range(WARNED_MODELS_MAX - 1):  # "gpt-4o" stays among the remembered
            state.warn_unknown_model(f"other-{i}")
        state.warn_unknown_model("gpt-4o")
        for i in range(WARNED_MODELS_MAX):  # now it is pushed out: warned again
            state.warn_unknown_model(f"more-{i}")
        state.warn_unknown_model("gpt-4o")
    finally:
        logger.removeHandler(handler)
    assert sum("'gpt-4o'" in m for m in seen) == 2
    assert state.unknown_model_requests == 5 + 2 * WARNED_MODELS_MAX - 1
