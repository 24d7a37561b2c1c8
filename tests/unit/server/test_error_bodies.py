"""The error handlers and response framing, through a tiny FastAPI app: malformed JSON,
wrong types and bad paths answer the contract's error body naming the problem; an
unexpected exception is a bare 500; SSE framing and non-finite numbers."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from loraserve.server.errors import (
    ApiError,
    JsonResponse,
    error_body,
    exceed_context_size,
    install_error_handlers,
    parse_body,
    unavailable,
)
from loraserve.server.schemas import CompletionRequest, LoraScales
from loraserve.server.sse import SSE_DONE, sse_event


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/completion")
    async def completion(req: CompletionRequest) -> dict[str, Any]:
        return {"n_predict": req.n_predict}

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, Any]:
        return {"prompt": parse_body(CompletionRequest, await request.body()).prompt}

    @app.post("/slots/{id_slot}")
    async def slots(id_slot: int, action: str) -> dict[str, Any]:
        return {"id_slot": id_slot, "action": action}

    @app.post("/lora-adapters")
    async def set_adapters(request: Request) -> dict[str, Any]:
        LoraScales.model_validate(await request.json())
        return {"success": True}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret detail")

    @app.get("/too-long")
    async def too_long() -> None:
        raise exceed_context_size(5000, 4096)

    @app.get("/loading")
    async def loading() -> None:
        raise unavailable()

    @app.get("/stream-boom")
    async def stream_boom() -> StreamingResponse:
        async def gen():
            yield sse_event({"content": "a"})
            raise RuntimeError("mid-stream")

        return StreamingResponse(gen(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(make_app())


def assert_error(resp, status: int, type_: str) -> str:
    assert resp.status_code == status
    body = resp.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == status and body["error"]["type"] == type_
    return body["error"]["message"]


@pytest.mark.parametrize("path", ["/completion", "/raw"])
def test_malformed_json_is_400(client, path):
    resp = client.post(
        path, content=b'{"prompt": "x",', headers={"content-type": "application/json"}
    )
    assert "Invalid JSON" in assert_error(resp, 400, "invalid_request_error")


@pytest.mark.parametrize("path", ["/completion", "/raw"])
def test_wrong_type_is_400_naming_the_field(client, path):
    resp = client.post(path, json={"prompt": "x", "top_k": "many"})
    assert "top_k" in assert_error(resp, 400, "invalid_request_error")
    resp = client.post(path, json=["x"])
    assert "JSON object" in assert_error(resp, 400, "invalid_request_error")


def test_good_request_and_curl_content_type(client):
    assert client.post("/completion", json={"prompt": "x", "max_tokens": 3}).json() == {
        "n_predict": 3
    }
    form = {"content-type": "application/x-www-form-urlencoded"}
    resp = client.post("/raw", content=b'{"prompt": "hi"}', headers=form)
    assert resp.json() == {"prompt": ["hi"]}
    for path in ("/raw", "/completion"):
        message = assert_error(client.post(path), 400, "invalid_request_error")
        assert message == "request body is required (a JSON object)"


def test_path_and_query_errors_name_the_parameter(client):
    message = assert_error(client.post("/slots/abc"), 400, "invalid_request_error")
    assert message.startswith("id_slot: Input should be a valid integer")
    assert "action: Field required" in message
    assert client.post("/slots/1?action=save").json() == {"id_slot": 1, "action": "save"}


def test_stray_validation_error_is_400(client):
    ok = client.post("/lora-adapters", json=[{"id": 0, "scale": 0.5}])
    assert ok.json() == {"success": True}
    resp = client.post("/lora-adapters", json=[{"id": 0, "scale": "big"}])
    assert assert_error(resp, 400, "invalid_request_error").startswith("[0].scale:")


def test_unknown_route_and_method(client):
    assert assert_error(client.get("/nope"), 404, "not_found_error") == "File Not Found"
    resp = client.get("/completion")
    assert_error(resp, 405, "invalid_request_error")
    assert resp.headers["allow"] == "POST"


def test_unexpected_exception_is_500_without_details(client, caplog):
    resp = client.get("/boom")
    message = assert_error(resp, 500, "server_error")
    assert "secret" not in message
    assert any("unhandled error" in r.message for r in caplog.records)
    assert client.get("/too-long").status_code == 400


def test_error_mid_stream_closes_the_stream(client):
    resp = client.get("/stream-boom")
    assert resp.status_code == 200 and resp.content == b'data: {"content":"a"}\n\n'


def test_api_error_bodies(client):
    resp = client.get("/too-long")
    assert_error(resp, 400, "exceed_context_size_error")
    assert resp.json()["error"]["n_prompt_tokens"] == 5000 and resp.json()["error"]["n_ctx"] == 4096
    assert client.get("/loading").json() == {
        "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
    }
    assert error_body("m", "not_supported_error") == {
        "error": {"code": 501, "message": "m", "type": "not_supported_error"}
    }
    assert ApiError(401, "authentication_error", "Invalid API Key").body()["error"]["code"] == 401


def test_json_response_writes_non_finite_as_null():
    resp = JsonResponse({"logprob": -math.inf, "text": "é"})
    assert resp.body == '{"logprob":null,"text":"é"}'.encode()


def test_sse_framing():
    assert (
        sse_event({"content": "é", "p": -math.inf}) == 'data: {"content":"é","p":null}\n\n'.encode()
    )
    assert SSE_DONE == b"data: [DONE]\n\n"
