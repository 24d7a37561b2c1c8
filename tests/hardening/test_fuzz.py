"""Fuzz (bounded) of bodies, headers and raw HTTP: random bodies built from the real field
names with arbitrary JSON values, raw bytes under odd content types, arbitrary header names
and values on every endpoint, and malformed request lines, framing and encodings sent on a
raw socket. Never a 5xx: only 4xx (or a success), the contract's error body where the app
answers, and the server stays healthy. ``LORASERVE_FUZZ_EXAMPLES`` multiplies the number of
examples of each property (default 1: CI's 80 header and 60 body/raw cases), for longer runs."""

from __future__ import annotations

import json
import logging
import os
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraserve.server.native.embeddings import EmbeddingRequest, RerankRequest
from loraserve.server.schemas import CompletionRequest, OAIChatRequest, TokenizeRequest
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
    """A server with an API key, for the header and raw HTTP fuzz."""
    with serve_in_thread(["-np", "2", "-c", "256", "--api-key", "k"]) as s:
        yield s


def check(r) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"], r.text


SCALE = int(os.environ.get("LORASERVE_FUZZ_EXAMPLES", "1"))


@settings(
    max_examples=80 * SCALE,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
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
        answer = b""
        try:
            s.sendall(raw)
            # The server may answer 4xx and close before the request is all read (an
            # oversized header): the half-close then finds no connection (ENOTCONN).
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except OSError:
            pass  # refused by closing (reset): fine, whatever was read is checked
    if answer:
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500 or status == 200, answer[:300]
        if status >= 400 and b"application/json" in answer.split(b"\r\n\r\n")[0]:
            assert b'"error"' in answer, answer[:300]
    assert srv.client.get("/health").json() == {"status": "ok"}
    assert not [r for r in caplog.records if r.name.startswith("loraserve")], caplog.text


# ---- bodies and content types -------------------------------------------------------

BODY_ENDPOINTS = [
    "/completion",
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/lora-adapters",
    "/lora-adapters/unload",
    "/slots/0?action=save",
    "/slots/0?action=restore",
    "/embedding",
    "/v1/embeddings",
    "/rerank",
]
FIELDS = sorted(
    {
        *CompletionRequest.model_fields,
        *OAIChatRequest.model_fields,
        *TokenizeRequest.model_fields,
        *EmbeddingRequest.model_fields,
        *RerankRequest.model_fields,
        "max_tokens",
        "logprobs",
        "tokens",
        "filename",
        "id",
        "scale",
        "path",
    }
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.integers(-3, 300),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
BODIES = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6)
SETTINGS = settings(
    max_examples=60 * SCALE,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def open_srv(tmp_path_factory):
    """A server without API keys, for the body fuzz."""
    args = ["-np", "2", "-c", "256", "--slot-save-path", str(tmp_path_factory.mktemp("fz"))]
    args.append("--reranking")  # the embedding and rerank endpoints too
    with serve_in_thread(args) as s:
        yield s


def check_body(r) -> None:
    if r.status_code == 501:  # a feature this server lacks (adapters before the registry)
        assert r.json()["error"]["type"] == "not_supported_error"
        return
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and isinstance(err["message"], str), r.text


@SETTINGS
@given(path=st.sampled_from(BODY_ENDPOINTS), body=BODIES, stream=st.booleans())
def test_field_fuzz(open_srv, path, body, stream) -> None:
    if "n_predict" in body or "max_tokens" in body or stream:
        body = {**body, "n_predict": 4, "max_tokens": 4}
    if stream:
        body["stream"] = True
    r = open_srv.client.post(path, json=body)
    check_body(r)


@SETTINGS
@given(
    path=st.sampled_from(BODY_ENDPOINTS),
    raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode),
    ctype=st.sampled_from(
        [
            "application/json",
            "text/plain",
            "",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json; charset=latin-1",
        ]
    ),
)
def test_raw_fuzz(open_srv, path, raw, ctype) -> None:
    headers = {"Content-Type": ctype} if ctype else {}
    check_body(open_srv.client.post(path, content=raw, headers=headers))


def test_odd_requests_and_still_healthy(open_srv) -> None:
    c = open_srv.client
    check_body(c.post("/completion", content=json.dumps({"prompt": "a"}).encode("utf-16")))
    check_body(c.post("/completion", content=b'{"prompt": "\xff\xfe"}'))
    check_body(c.post("/completion", content=b'{"prompt": "a", "prompt": 5}'))
    check_body(c.post("/completion", content=b"[" * 5000 + b"]" * 5000))
    check_body(c.request("PUT", "/completion", json={}))
    check_body(c.request("DELETE", "/slots"))
    check_body(c.get("/slots?fail_on_no_slot=x"))
    check_body(c.get("/completion/../health"))
    assert c.get("/health").json() == {"status": "ok"}
