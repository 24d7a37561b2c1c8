"""Refused requests (4xx) and clients that leave mid-answer each leave one log line naming
the client, the endpoint and the reason (issue 31 item 13)."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from tests.server_util import serve_in_thread


@pytest.fixture(scope="module")
def srv():
    with serve_in_thread(["-np", "1", "-c", "256", "--temp", "0"]) as s:
        yield s


def lines(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if word in r.getMessage()]


def test_refusal_leaves_one_line(srv, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="loraserve.server"):
        r = srv.client.post("/completion", json={"prompt": "the", "n_predict": "many"})
        assert r.status_code == 400
        r2 = srv.client.post("/v1/chat/completions", json={"messages": "x" * 5000})
        assert r2.status_code == 400
    (line,) = lines(caplog, "/completion from")
    assert line.startswith("refused POST /completion from 127.0.0.1:") and " 400 " in line
    assert "n_predict" in line
    (line2,) = lines(caplog, "/v1/chat/completions from")
    assert len(line2) < 400  # a reason quoting the request is cut


def test_client_leaving_leaves_one_line(srv, caplog: pytest.LogCaptureFixture) -> None:
    body = {"prompt": "the", "n_predict": 200, "ignore_eos": True, "stream": True}
    with caplog.at_level(logging.INFO, logger="loraserve.server"):
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            with client.stream("POST", "/completion", json=body) as r:
                assert r.status_code == 200
                next(r.iter_lines())  # the first token came: the answer is running
        deadline = time.monotonic() + 30  # wait for the server to notice, not a timing check
        while not lines(caplog, " left ") and time.monotonic() < deadline:
            time.sleep(0.05)
        done = srv.client.post("/completion", json={"prompt": "the", "n_predict": 2})
        assert done.status_code == 200  # a full answer leaves no such line
    (line,) = lines(caplog, " left ")
    assert line.startswith("client left POST /completion from 127.0.0.1:")
    assert line.endswith("cancelled unfinished")
