"""Embeddings and reranking over HTTP (llama-server's shapes, the openai client), under
LoRA mixes, and their errors: 501 without the flag, 400 naming the problem otherwise."""

from __future__ import annotations

import base64
import math
import struct

import openai
import pytest

from tests.server_util import peft_folder, serve_in_thread

DOCS = ["the cat sat", "a dog ran far away", "cats and dogs", "zz"]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return peft_folder(tmp_path_factory.mktemp("emb") / "style", 4, magnitude=1.0)


@pytest.fixture(scope="module")
def srv(adapter):
    args = ["--embedding", "--pooling", "mean", "-np", "2", "-c", "512"]
    with serve_in_thread([*args, "--lora-scaled", f"{adapter}:0"]) as s:
        yield s


def norm2(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def embed(srv, path: str = "/v1/embeddings", **body) -> dict:
    r = srv.client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_oai_shape_normalised_and_usage(srv) -> None:
    res = embed(srv, input=["hello world", "the cat"])
    assert res["object"] == "list" and len(res["data"]) == 2
    assert [d["index"] for d in res["data"]] == [0, 1]
    for d in res["data"]:
        assert d["object"] == "embedding" and len(d["embedding"]) > 1
        assert abs(norm2(d["embedding"]) - 1) < 1e-4
    n = [
        len(srv.client.post("/tokenize", json={"content": t, "add_special": True}).json()["tokens"])
        for t in ("hello world", "the cat")
    ]
    assert res["usage"] == {"prompt_tokens": sum(n), "total_tokens": sum(n)}


def test_input_forms_are_one_prompt_each(srv) -> None:
    same = embed(
        srv,
        input=[
            "hello world",
            {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
            {"prompt_string": "hello world"},
        ],
    )["data"]
    assert same[0]["embedding"] == same[1]["embedding"] == same[2]["embedding"]
    for value, n in [("", 1), ([12, 34, 56], 1), ([12, "x", 5], 1), ([[12, 34], "y"], 2)]:
        assert len(embed(srv, input=value)["data"]) == n


def test_native_endpoint_and_normalisation(srv) -> None:
    native = embed(srv, "/embedding", content="the cat", embd_normalize=-1)
    assert len(native) == 1 and native[0]["index"] == 0 and len(native[0]["embedding"]) == 1
    raw = native[0]["embedding"][0]
    unit = embed(srv, "/embeddings", input="the cat")[0]["embedding"][0]
    assert abs(norm2(unit) - 1) < 1e-4 and abs(norm2(raw) - 1) > 1e-3
    assert all(abs(u - r / norm2(raw)) < 1e-5 for u, r in zip(unit, raw, strict=True))
    maxabs = embed(srv, "/embedding", content="the cat", embd_normalize=0)[0]["embedding"][0]
    assert abs(max(abs(x) for x in maxabs) - 32760) < 1e-2


def test_base64_equals_float(srv) -> None:
    floats = embed(srv, input="test base64")["data"][0]["embedding"]
    b64 = embed(srv, input="test base64", encoding_format="base64")["data"][0]
    assert b64["encoding_format"] == "base64"
    raw = base64.b64decode(b64["embedding"])
    assert list(struct.unpack(f"{len(raw) // 4}f", raw)) == pytest.approx(floats, abs=1e-6)


def test_openai_client(srv) -> None:
    client = openai.OpenAI(api_key="x", base_url=f"{srv.url}/v1")
    res = client.embeddings.create(model="text-embedding-3-small", input=["a", "b", "c"])
    assert len(res.data) == 3 and len(res.data[0].embedding) > 1


def test_lora_mix_changes_the_embedding(srv, adapter) -> None:
    base = embed(srv, input="the cat sat")["data"][0]["embedding"]
    mixed = embed(srv, input="the cat sat", lora=[{"id": 0, "scale": 1.0}])["data"][0]["embedding"]
    named = embed(srv, input="the cat sat", model=adapter.name)["data"][0]["embedding"]
    assert mixed == named and max(abs(a - b) for a, b in zip(base, mixed, strict=True)) > 1e-3
    again = embed(srv, input="the cat sat")["data"][0]["embedding"]
    assert again == base


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"input": []}, "input"),
        ({"input": {"content": "string"}}, "content"),
        ({"input": {"content": [{"type": "unknown"}]}}, "text parts"),
        ({"input": {"content": [{"type": "image_url", "image_url": {"url": "x"}}]}}, "text"),
        ({}, '"input" or "content"'),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "embd_normalize": "2"}, "embd_normalize"),
        ({"input": [10**9]}, "vocabulary"),
        ({"input": "x", "lora": [{"id": 7, "scale": 1}]}, "lora"),
        ({"input": "this is a test " * 200}, "too large"),
    ],
)
def test_bad_inputs_are_400(srv, body, needle) -> None:
    r = srv.client.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert r.json()["error"]["type"] in ("invalid_request_error", "exceed_context_size_error")


def test_pooling_none_and_disabled_servers() -> None:
    with serve_in_thread(["--embedding", "--pooling", "none", "-np", "1", "-c", "256"]) as s:
        n = len(
            s.client.post(
                "/tokenize", json={"content": "hello hello hello", "add_special": True}
            ).json()["tokens"]
        )
        rows = embed(s, "/embeddings", input="hello hello hello")[0]["embedding"]
        assert len(rows) == n and all(abs(norm2(r) - 1) > 1e-3 for r in rows)
        r = s.client.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 400 and "not OAI compatible" in r.json()["error"]["message"]
        r = s.client.post("/rerank", json={"query": "x", "documents": ["y"]})
        assert r.status_code == 501 and "--reranking" in r.json()["error"]["message"]
    with serve_in_thread(["-np", "1", "-c", "256"]) as s:
        for path in ("/embedding", "/v1/embeddings"):
            r = s.client.post(path, json={"input": "x"})
            assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
            assert "--embeddings" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def rerank_srv():
    with serve_in_thread(["--reranking", "-np", "2", "-c", "512"]) as s:
        yield s


def test_rerank_jina_and_tei(rerank_srv) -> None:
    jina = rerank_srv.client.post("/rerank", json={"query": "cats", "documents": DOCS}).json()
    scores = [r["relevance_score"] for r in jina["results"]]
    assert sorted(scores, reverse=True) == scores and len(scores) == 4
    assert sorted(r["index"] for r in jina["results"]) == [0, 1, 2, 3]
    assert jina["usage"]["prompt_tokens"] == jina["usage"]["total_tokens"] > 0
    tei = rerank_srv.client.post(
        "/v1/rerank", json={"query": "cats", "texts": DOCS, "return_text": True, "top_n": 2}
    ).json()
    assert len(tei) == 2 and [t["index"] for t in tei] == [r["index"] for r in jina["results"][:2]]
    assert [t["score"] for t in tei] == scores[:2] and tei[0]["text"] == DOCS[tei[0]["index"]]
    for top_n, n in [(None, 4), (2, 2), (99, 4), (0, 0)]:
        body = {"query": "cats", "documents": DOCS, **({} if top_n is None else {"top_n": top_n})}
        assert len(rerank_srv.client.post("/reranking", json=body).json()["results"]) == n
    # the embedding endpoints work on a reranking server (pooling rank: the last token)
    assert len(embed(rerank_srv, input="x")["data"]) == 1


@pytest.mark.parametrize("documents", [[], None, 123, [1, 2, 3]])
def test_rerank_bad_documents_are_400(rerank_srv, documents) -> None:
    r = rerank_srv.client.post("/rerank", json={"query": "q", "documents": documents})
    assert r.status_code == 400 and "documents" in r.json()["error"]["message"]
    r = rerank_srv.client.post("/rerank", json={"documents": ["a"]})
    assert r.status_code == 400 and "query" in r.json()["error"]["message"]
