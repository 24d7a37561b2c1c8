"""The Ray ingress refuses a web page's cross-site write without a preflight before the
coordinator logs it (issue 31 items 4 and 11): the same 415 as a single server's CORS layer
(`server/cors.py`), decided on the headers alone; JSON writes, same-site pages and clients
that send no `Origin` pass on to the key and size checks."""

from __future__ import annotations

import json

import pytest
from starlette.requests import Request

from loraserve.cluster.guard import IngressGuard


def request(method: str, headers: dict[str, str], path: str = "/lora-adapters/load") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in {"host": "srv:8080", **headers}.items()]
    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": raw}
    return Request(scope)


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", None])
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_cross_site_simple_writes_are_refused(method: str, kind: str | None) -> None:
    headers = {"origin": "http://evil.example", **({"content-type": kind} if kind else {})}
    r = IngressGuard(["k"]).refuse(request(method, headers))
    assert r is not None and r.status_code == 415  # before the key check's 401
    assert "application/json" in json.loads(bytes(r.body))["error"]["message"]


@pytest.mark.parametrize(
    "headers",
    [
        {"origin": "http://evil.example", "content-type": "application/json"},  # preflighted
        {"origin": "http://srv:8080", "content-type": "text/plain"},  # the server's own page
        {"content-type": "text/plain"},  # curl, SDKs: no Origin
    ],
)
def test_other_requests_pass_to_the_next_checks(headers: dict[str, str]) -> None:
    assert IngressGuard().refuse(request("POST", headers)) is None
    refused = IngressGuard(["k"]).refuse(request("POST", headers))
    assert refused is not None and refused.status_code == 401  # the key check still applies


def test_reads_are_not_refused() -> None:
    get = request("GET", {"origin": "http://evil.example"}, path="/lora-adapters")
    assert IngressGuard().refuse(get) is None
