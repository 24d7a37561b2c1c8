"""Every limit holds at its boundary over HTTP, with a clear 4xx naming the field: body
size (declared or streamed), prompt tokens against a slot's context (n_predict beyond it
generates until the context is full, as llama-server), prompts per request, number and
length of stop strings, logit_bias entries, n_probs, LoRA scales; and adapter loads only
from the allowed directory, only regular files of bounded size."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from loraserve.server.app import MAX_BODY_BYTES
from loraserve.server.fields import MAX_LOGIT_BIAS, MAX_PROMPTS, MAX_STOP, MAX_STOP_LEN
from loraserve.server.native.lora_api import MAX_ADAPTER_BYTES
from loraserve.server.schemas import (
    MAX_LORA_SCALE,
    N_PROBS_MAX,
)
from tests.server_util import peft_folder, serve_in_thread

N_CTX = 128  # -c 256 over -np 2
MSGS = [{"role": "user", "content": "the cat"}]


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("lim-loras")
    outside = tmp_path_factory.mktemp("lim-outside")
    peft_folder(d / "ok", 1)
    peft_folder(outside / "theirs", 2)
    with open(d / "huge.gguf", "wb") as f:  # sparse: no disk used, never read
        f.truncate(MAX_ADAPTER_BYTES + 1)
    big = d / "big-peft"
    peft_folder(big, 3)
    with open(big / "adapter_model.safetensors", "r+b") as f:
        f.truncate(MAX_ADAPTER_BYTES + 1)
    os.symlink(outside / "theirs", d / "escape")
    os.symlink("/dev/zero", d / "zero.gguf")
    os.symlink(d / "ok", d / "alias")  # a link that stays inside is fine
    os.mkfifo(d / "pipe.gguf")
    (d / "folder.gguf").mkdir()
    return d


@pytest.fixture(scope="module")
def srv(lora_dir):
    with serve_in_thread(["-np", "2", "-c", "256", "-n", "4", "--lora-dir", str(lora_dir)]) as s:
        yield s


def refused(srv, path: str, body: object, field: str | tuple, status: int = 400) -> dict:
    """A refusal with `status` whose message names `field` (or one of several names)."""
    r = srv.client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    names = (field,) if isinstance(field, str) else field
    assert err["code"] == status and any(n in err["message"] for n in names), err
    return err


def accepted(srv, path: str, body: object) -> dict:
    r = srv.client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_body_size_declared_and_streamed(srv) -> None:
    host, port = srv.url.removeprefix("http://").split(":")

    def exchange(head: bytes, chunks: int) -> str:
        raw = b""
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(head)
            piece = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
            try:
                for _ in range(chunks):
                    s.sendall(piece)
                s.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the server answered and closed before the end: fine
            while b'"}}' not in raw and (chunk := s.recv(65536)):
                raw += chunk
        return raw.decode()

    post = b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    declared = exchange(post + b"Content-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1), 0)
    streamed = exchange(post + b"Transfer-Encoding: chunked\r\n\r\n", MAX_BODY_BYTES // 2**20 + 2)
    for answer in (declared, streamed):
        head, _, body = answer.partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 413"), head
        assert "larger than" in json.loads(body)["error"]["message"]
    assert srv.client.get("/health").status_code == 200


@pytest.mark.parametrize("path", ["/completion", "/v1/completions"])
def test_prompt_tokens_against_the_context(srv, path) -> None:
    fits = [1] + [17] * (N_CTX - 2)
    accepted(srv, path, {"prompt": fits, "n_predict": 1})
    err = refused(srv, path, {"prompt": [*fits, 17]}, "context")
    assert err["type"] == "exceed_context_size_error"
    assert (err["n_prompt_tokens"], err["n_ctx"]) == (N_CTX, N_CTX)
    err = refused(srv, path, {"prompt": ["the", [*fits, 17, 17]]}, "context")
    assert err["type"] == "exceed_context_size_error" and err["n_prompt_tokens"] == N_CTX + 1


def test_chat_prompt_against_the_context(srv) -> None:
    long = [{"role": "user", "content": "the " * N_CTX}]
    err = refused(srv, "/v1/chat/completions", {"messages": long}, "context")
    assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == N_CTX


@pytest.mark.parametrize(
    "path,field,base",
    [
        ("/completion", "n_predict", {"prompt": "a"}),
        ("/v1/completions", "max_tokens", {"prompt": "a"}),
        ("/v1/chat/completions", "max_tokens", {"messages": MSGS}),
        ("/v1/chat/completions", "max_completion_tokens", {"messages": MSGS}),
    ],
)
def test_n_predict_beyond_the_context_runs_until_it_is_full(srv, path, field, base) -> None:
    names = (field, "n_predict")  # the name the client used, or the canonical one
    refused(srv, path, {**base, field: 2**31}, names)
    refused(srv, path, {**base, field: -2}, names)
    body = {**base, field: N_CTX + 1000, "ignore_eos": True, "temperature": 0}
    res = accepted(srv, path, body)  # as llama-server: generate until the context is full
    if path == "/completion":
        assert res["stop_type"] == "limit" and res["truncated"] is True
        assert res["tokens_evaluated"] + res["tokens_predicted"] == N_CTX
    else:
        assert res["choices"][0]["finish_reason"] == "length"
        assert res["usage"]["prompt_tokens"] + res["usage"]["completion_tokens"] == N_CTX
    short = accepted(srv, "/completion", {"prompt": "a", "n_predict": 2})
    assert short["stop_type"] == "limit" and short["truncated"] is False


def test_prompts_per_request(srv) -> None:
    res = accepted(srv, "/completion", {"prompt": ["a", "the", [1, 17]], "n_predict": 1})
    assert [x["index"] for x in res] == [0, 1, 2]
    refused(srv, "/completion", {"prompt": ["a"] * (MAX_PROMPTS + 1)}, f"at most {MAX_PROMPTS}")


@pytest.mark.parametrize(
    "path,base", [("/completion", {"prompt": "a"}), ("/v1/chat/completions", {"messages": MSGS})]
)
def test_stop_strings(srv, path, base) -> None:
    accepted(srv, path, {**base, "stop": [f"s{i}" for i in range(MAX_STOP)]})
    accepted(srv, path, {**base, "stop": "x" * MAX_STOP_LEN})
    refused(srv, path, {**base, "stop": [f"s{i}" for i in range(MAX_STOP + 1)]}, "stop")
    refused(srv, path, {**base, "stop": ["ok", "x" * (MAX_STOP_LEN + 1)]}, "stop")


def test_logit_bias_entries(srv) -> None:
    body = {"prompt": "a", "n_predict": 1}
    pairs = [[t, -0.5] for t in range(MAX_LOGIT_BIAS)]
    accepted(srv, "/completion", {**body, "logit_bias": [[t % 300, b] for t, b in pairs]})
    refused(srv, "/completion", {**body, "logit_bias": [*pairs, [1, 1.0]]}, "logit_bias")
    as_dict = {str(t): -0.5 for t in range(MAX_LOGIT_BIAS + 1)}
    refused(srv, "/completion", {**body, "logit_bias": as_dict}, "logit_bias")
    refused(srv, "/completion", {**body, "logit_bias": [[10**6, 1.0]]}, "logit_bias")


def test_n_probs(srv) -> None:
    res = accepted(srv, "/completion", {"prompt": "a", "n_predict": 1, "n_probs": N_PROBS_MAX})
    assert len(res["completion_probabilities"][0]["top_logprobs"]) == N_PROBS_MAX
    refused(srv, "/completion", {"prompt": "a", "n_probs": N_PROBS_MAX + 1}, "n_probs")
    refused(srv, "/v1/completions", {"prompt": "a", "logprobs": N_PROBS_MAX + 1}, "logprobs")
    chat = {"messages": MSGS, "logprobs": True, "top_logprobs": N_PROBS_MAX + 1}
    refused(srv, "/v1/chat/completions", chat, "top_logprobs")


@pytest.mark.parametrize(
    "path,status,words",
    [
        ("huge.gguf", 400, "larger than"),
        ("big-peft", 400, "larger than"),
        ("escape", 403, "outside"),
        ("zero.gguf", 403, "outside"),
        ("pipe.gguf", 400, "regular file"),
        ("folder.gguf", 400, "folder without"),
        ("../lim-outside0/theirs", 403, "outside"),
        ("ok/../../x", 403, "outside"),
        ("/etc/passwd", 403, "outside"),
        ("missing", 404, "no adapter"),
    ],
)
def test_adapter_load_refusals(srv, path, status, words) -> None:
    err = refused(srv, "/lora-adapters/load", {"path": path}, words, status)
    assert (
        err["type"]
        == {400: "invalid_request_error", 403: "permission_error", 404: "not_found_error"}[status]
    )


def test_lora_scales(srv) -> None:
    """A scale so large that it can only overflow to inf/NaN is the client's 400, not a 500."""
    ok = accepted(srv, "/lora-adapters/load", {"path": "ok", "scale": 0.0})["id"]
    for scale in (MAX_LORA_SCALE, -MAX_LORA_SCALE):
        lora = [{"id": ok, "scale": scale}]
        res = accepted(srv, "/completion", {"prompt": "the cat", "lora": lora})
        assert res["generation_settings"]["lora"] == lora
    for scale in (MAX_LORA_SCALE * 1.01, 1e300, -1e300):
        lora = [{"id": ok, "scale": scale}]
        refused(srv, "/completion", {"prompt": "the cat", "lora": lora}, "scale")
        refused(srv, "/v1/chat/completions", {"messages": MSGS, "lora": lora}, "scale")
        refused(srv, "/lora-adapters", lora, "scale")
        refused(srv, "/lora-adapters/load", {"path": "ok", "scale": scale}, "scale")
    assert srv.client.get("/lora-adapters").json()[0]["scale"] == 0.0


def test_adapter_load_inside_and_through_an_inner_link(srv) -> None:
    first = accepted(srv, "/lora-adapters/load", {"path": "ok", "scale": 0.0})
    second = accepted(srv, "/lora-adapters/load", {"path": "alias", "scale": 0.0})
    assert first["path"] == second["path"]  # resolved to the real folder
    assert srv.client.get("/health").status_code == 200
