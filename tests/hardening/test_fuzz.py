"""Fuzz of headers and of raw HTTP (bounded): arbitrary header names and values on every
endpoint, and malformed request lines, framing and encodings sent on a raw socket. Only
4xx (or a success), the contract's error body where the app answers, and the server stays
healthy. (`tests/http/test_fuzz.py` covers bodies and content types.)"""

from __future__ import annotations

import logging
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server_util import serve_in_thread

ENDPOINTS = [
    ("POST", "/completion", {"prompt": "a", "n_predict": 2}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]}),
    ("POST", "/tokenize", {"content": "a"}),
    ("POST", "/lora-adapters", []),
    ("GET", "/slots", None),
    ("GET", "/health", None),
    ("GET", "/props", None),
]
NAMES = st.sampled_from(
    "Content-Type Accept Authorization X-Api-Key Content-Encoding Expect Connection Range"
    " Accept-Encoding Cookie Origin X-Forwarded-For Upgrade TE Accept-Charset".split()
) | st.from_regex(r"\A[A-Za-z0-9!#$%&'*+.^_`|~-]{1,40}\Z")
VALUES = st.text(  # what HTTP/1.1 allows in a value: no controls, no surrounding blanks
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=300
).map(lambda v: v.strip(" \t"))
RAW = [
    b"GARBAGE\r\n\r\n",
    b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 9\r\n\r\n{}}",
    b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n{}",
    b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 2"
    b"\r\n\r\n{}",
    b"POST /completion HTTP/1.1\r\nHost: x\r\nX-Api-Key: \xff\xfe\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /health?" + b"a=1&" * 4000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /" + b"x" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 2000 + b"\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 100_000 + b"\r\n\r\n",
    b"GET /%00%ff/../health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /completion HTTP/1.0\r\nHost: x\r\nContent-Length: 40\r\n\r\n{",  # stops mid-body
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello on the plain port
]


@pytest.fixture(scope="module")
def srv():
    with serve_in_thread(["-np", "2", "-c", "256", "--api-key", "k"]) as s:
        yield s


def check(r) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"], r.text


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    headers=st.dictionaries(NAMES, VALUES, max_size=6),
    keyed=st.booleans(),
)
def test_header_fuzz(srv, endpoint, headers, keyed, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="loraserve")
    method, path, body = endpoint
    if keyed:
        headers = {**headers, "Authorization": "Bearer k"}
    sent = {k: v.encode("latin-1") for k, v in headers.items()}
    r = srv.client.request(method, path, json=body, headers=sent)
    check(r)
    assert not [r for r in caplog.records if r.name.startswith("loraserve")], caplog.text


@pytest.mark.parametrize("raw", RAW, ids=[f"raw{i}" for i in range(len(RAW))])
def test_raw_http(srv, raw: bytes, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="loraserve")
    host, port = srv.url.removeprefix("http://").split(":")
    raw = raw.replace(b"Host: x\r\n", b"Host: x\r\nAuthorization: Bearer k\r\n")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            answer = b""  # refused by closing: fine
    if answer:
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500 or status == 200, answer[:300]
        if status >= 400 and b"application/json" in answer.split(b"\r\n\r\n")[0]:
            assert b'"error"' in answer, answer[:300]
    assert srv.client.get("/health").json() == {"status": "ok"}
    assert not [r for r in caplog.records if r.name.startswith("loraserve")], caplog.text
