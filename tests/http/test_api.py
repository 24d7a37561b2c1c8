"""llama-server's API over HTTP on a tiny model: /completion shapes, prompt forms, exact
cache accounting, streaming framing, probabilities, stops, and the service endpoints."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.server_util import Served, serve_in_thread

CONTRACT_FIELDS = {
    "content",
    "id_slot",
    "stop",
    "model",
    "tokens_predicted",
    "tokens_evaluated",
    "tokens_cached",
    "truncated",
    "stop_type",
    "stopping_word",
    "generation_settings",
    "timings",
}
TIMINGS = (
    "cache_n prompt_n prompt_ms prompt_per_token_ms prompt_per_second predicted_n predicted_ms"
    " predicted_per_token_ms predicted_per_second"
).split()


@pytest.fixture(scope="module")
def srv():
    with serve_in_thread(["-np", "2", "-c", "512", "--temp", "0", "--cache-ram", "0"]) as s:
        yield s


def complete(srv: Served, **body) -> dict:
    body.setdefault("n_predict", 6)
    body.setdefault("ignore_eos", True)
    r = srv.client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def tokenize(srv: Served, text: str, add_special: bool = True) -> list[int]:
    return srv.client.post("/tokenize", json={"content": text, "add_special": add_special}).json()[
        "tokens"
    ]


def test_completion_has_the_contract_fields(srv) -> None:
    res = complete(srv, prompt="the cat and the dog", n_predict=5, return_tokens=True)
    assert CONTRACT_FIELDS <= res.keys()
    assert res["stop"] is True and res["truncated"] is False
    assert res["stop_type"] == "limit" and res["stopping_word"] == ""
    assert res["tokens_predicted"] == 5 == len(res["tokens"])
    assert res["tokens_evaluated"] == len(tokenize(srv, "the cat and the dog"))
    assert res["id_slot"] in (0, 1)
    assert res["model"] == "tiny.gguf"
    assert set(TIMINGS) <= res["timings"].keys()
    assert res["timings"]["predicted_n"] == 5
    gs = res["generation_settings"]
    assert gs["n_predict"] == 5 and gs["temperature"] == 0 and gs["lora"] == []
    detok = srv.client.post("/detokenize", json={"tokens": res["tokens"]}).json()["content"]
    assert detok == res["content"]


def test_cache_n_and_prompt_n_are_exact(srv) -> None:
    prompt = "the of and to in is it that was for on are as with his they " * 3
    n = len(tokenize(srv, prompt))
    cold = complete(srv, prompt=prompt, cache_prompt=False)
    assert (cold["timings"]["cache_n"], cold["timings"]["prompt_n"]) == (0, n)
    warm = complete(srv, prompt=prompt)
    assert (warm["timings"]["cache_n"], warm["timings"]["prompt_n"]) == (n - 1, 1)
    assert warm["tokens_cached"] == n - 1 and warm["tokens_evaluated"] == n
    assert warm["content"] == cold["content"]
    # a longer prompt reuses exactly the shared prefix (the generated tokens differ from it)
    gen = complete(srv, prompt=prompt, return_tokens=True)["tokens"]
    ids = tokenize(srv, prompt)
    extra = [t for t in (300, 301, 302, 303) if t != gen[0]][:3]
    longer = complete(srv, prompt=ids + extra)
    assert (longer["timings"]["cache_n"], longer["timings"]["prompt_n"]) == (n, 3)
    assert longer["content"] == complete(srv, prompt=ids + extra, cache_prompt=False)["content"]


def test_prompt_forms(srv) -> None:
    text = "the cat was on his way"
    ids = tokenize(srv, text)
    by_text = complete(srv, prompt=text)["content"]
    assert complete(srv, prompt=ids)["content"] == by_text
    assert complete(srv, prompt=[text[:7], *tokenize(srv, text[7:], False)])["tokens_evaluated"]
    many = srv.client.post(
        "/completion", json={"prompt": [text, ids, "and the"], "n_predict": 4, "ignore_eos": True}
    ).json()
    assert isinstance(many, list) and [r["index"] for r in many] == [0, 1, 2]
    assert (
        many[0]["content"]
        == many[1]["content"]
        == complete(srv, prompt=text, n_predict=4)["content"]
    )
    assert many[2]["content"] == complete(srv, prompt="and the", n_predict=4)["content"]


def test_stop_word(srv) -> None:
    base = complete(srv, prompt="in the", n_predict=12)["content"]
    word = base[3:5]
    cut = base.index(word)
    res = complete(srv, prompt="in the", n_predict=12, stop=[word, "zzzz-never"])
    assert res["stop_type"] == "word" and res["stopping_word"] == word
    assert res["content"] == base[:cut]


def test_probabilities(srv) -> None:
    res = complete(srv, prompt="the cat", n_predict=3, n_probs=4)
    probs = res["completion_probabilities"]
    assert len(probs) == 3
    for p in probs:
        assert {"id", "token", "bytes", "logprob", "top_logprobs"} <= p.keys()
        assert len(p["top_logprobs"]) == 4 and p["logprob"] <= 0
        assert p["id"] == p["top_logprobs"][0]["id"]  # greedy: the most likely token
    post = complete(srv, prompt="the cat", n_predict=2, n_probs=2, post_sampling_probs=True)
    assert {"prob", "top_probs"} <= post["completion_probabilities"][0].keys()


def test_streaming_framing(srv) -> None:
    body = {"prompt": "the cat and", "n_predict": 5, "ignore_eos": True}
    plain = complete(srv, **body)
    events = srv.sse("/completion", {**body, "stream": True})
    assert "[DONE]" not in events
    parsed = [json.loads(e) for e in events]
    assert all(e["stop"] is False and len(e["tokens"]) == 1 for e in parsed[:-1])
    last = parsed[-1]
    assert last["stop"] is True and CONTRACT_FIELDS <= last.keys()
    assert "".join(e["content"] for e in parsed) == plain["content"]
    assert len(parsed) - 1 == last["tokens_predicted"] == 5


def test_streaming_probabilities_per_token(srv) -> None:
    events = srv.sse_json(
        "/completion", {"prompt": "a", "n_predict": 2, "n_probs": 3, "stream": True}
    )
    assert all(len(e["completion_probabilities"]) == 1 for e in events[:-1])


def test_disconnect_cancels_and_frees_the_slot(srv) -> None:
    body = {"prompt": "the", "n_predict": 240, "ignore_eos": True, "stream": True}
    with srv.client.stream("POST", "/completion", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 10
    while any(s["is_processing"] for s in srv.client.get("/slots").json()):
        assert time.monotonic() < deadline, "the cancelled request still holds its slot"
        time.sleep(0.05)
    assert complete(srv, prompt="the", n_predict=2)["tokens_predicted"] == 2


def test_non_streaming_disconnect_cancels(srv) -> None:
    body = json.dumps({"prompt": "the", "n_predict": 240, "ignore_eos": True, "id_slot": 1})
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        deadline = time.monotonic() + 10
        while not srv.client.get("/slots").json()[1]["is_processing"]:
            assert time.monotonic() < deadline
    deadline = time.monotonic() + 10
    while (slot := srv.client.get("/slots").json()[1])["is_processing"]:
        assert time.monotonic() < deadline, "the request went on after its client left"
        time.sleep(0.02)
    n_prompt = len(tokenize(srv, "the"))
    assert slot["n_tokens"] < n_prompt + 239  # stopped early: cancelled, not completed


def test_id_slot_is_honoured(srv) -> None:
    assert complete(srv, prompt="of the", id_slot=1)["id_slot"] == 1
    assert complete(srv, prompt="of the", id_slot=0)["id_slot"] == 0


def test_service_endpoints(srv) -> None:
    c = srv.client
    assert c.get("/health").json() == {"status": "ok"}
    props = c.get("/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
    assert "chat_template" in props and props["bos_token"] == "<s>"
    slots = c.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    assert all({"n_ctx", "is_processing"} <= s.keys() for s in slots)
    assert all(("params" in s) == ("id_task" in s) for s in slots)  # once a slot ran a task
    pieces = c.post("/tokenize", json={"content": "the cat", "with_pieces": True}).json()
    assert all({"id", "piece"} <= p.keys() for p in pieces["tokens"])
    ids = [p["id"] for p in pieces["tokens"]]
    assert c.post("/detokenize", json={"tokens": ids}).json()["content"] == " the cat"
    assert tokenize(srv, "the cat")[0] == 1  # BOS with add_special
    msgs = [{"role": "user", "content": "hi"}]
    prompt = c.post("/apply-template", json={"messages": msgs}).json()["prompt"]
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert c.get("/lora-adapters").json() == [] or isinstance(c.get("/lora-adapters").json(), list)
