"""llama-server's odds and ends on the tiny model: `return_progress` and `timings_per_token`
in streams, the Responses API, `logit_bias` keyed by token text, `--alias`/`--tags` in
/v1/models, several `--host` addresses, and the chat message order (assistant prefill,
`continue_final_message`)."""

from __future__ import annotations

import math
import socket

import openai
import pytest

from loraserve.server.config.args import parse_server_args
from loraserve.server.startup import StartupError, bind_all
from tests.server_util import serve_in_thread

UBATCH = 16
IMAGE = {"type": "input_image", "image_url": "data:,"}
LONG = [{"role": "user", "content": "the cat and the dog " * 6}]


@pytest.fixture(scope="module")
def srv():
    args = ["-np", "1", "-c", "512", "-b", str(UBATCH), "--temp", "0", "-a", "zeta,alpha"]
    with serve_in_thread([*args, "--tags", "chat,small"]) as s:
        yield s


def progress_of(events: list[dict]) -> list[dict]:
    return [e["prompt_progress"] for e in events if "prompt_progress" in e]


@pytest.mark.parametrize("path", ["/completion", "/v1/completions", "/v1/chat/completions"])
def test_return_progress(srv, path) -> None:
    body = {"max_tokens": 2, "stream": True, "return_progress": True, "cache_prompt": False}
    body |= {"messages": LONG} if "chat" in path else {"prompt": LONG[0]["content"]}
    events = srv.sse_json(path, body)
    steps = progress_of(events)
    first, last = steps[0], steps[-1]
    assert first["cache"] == first["processed"] == 0 and last["processed"] == last["total"]
    assert [s["processed"] for s in steps] == sorted({s["processed"] for s in steps})
    assert len(steps) == 1 + math.ceil(last["total"] / UBATCH)
    assert not progress_of(srv.sse_json(path, {**body, "return_progress": False}))


def test_timings_per_token_and_usage_timings(srv) -> None:
    body = {"messages": LONG, "max_tokens": 3, "stream": True, "timings_per_token": True}
    events = srv.sse_json(
        "/v1/chat/completions", body | {"stream_options": {"include_usage": True}}
    )
    assert "timings" not in events[0] and events[0]["choices"][0]["delta"]["role"] == "assistant"
    tokens = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert tokens and all(e["timings"]["prompt_n"] > 0 for e in tokens)
    assert events[-1]["choices"] == [] and events[-1]["timings"]["predicted_n"] == 3


def test_responses_api(srv) -> None:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
    kw = {"model": "m", "input": [{"role": "user", "content": "the cat"}], "max_output_tokens": 4}
    res = client.responses.create(**kw)
    want = srv.client.post(
        "/v1/chat/completions", json={"messages": kw["input"], "max_tokens": 4}
    ).json()["choices"][0]["message"]["content"]
    assert res.id.startswith("resp_") and res.output[0].id.startswith("msg_")
    assert res.output_text == want and res.usage.output_tokens == 4
    # the limit cut the answer: OpenAI's `incomplete` (parsed by the openai client's types)
    assert res.status == "incomplete" and res.incomplete_details.reason == "max_output_tokens"
    text, done = "", None
    for ev in client.responses.create(**kw, stream=True):
        text += ev.delta if ev.type == "response.output_text.delta" else ""
        done = ev if ev.type in ("response.completed", "response.incomplete") else done
    assert done is not None and text == done.response.output_text == want
    assert done.type == "response.incomplete" and done.response.status == "incomplete"
    assert done.response.incomplete_details.reason == "max_output_tokens"
    # an answer that ends by itself (a stop word here) is `completed`, with no details
    stop = client.responses.create(
        **{**kw, "max_output_tokens": 64}, extra_body={"stop": [want[:1]]}
    )
    assert stop.status == "completed" and stop.incomplete_details is None
    kinds = [
        e.type for e in client.responses.create(**kw, stream=True, extra_body={"stop": [want[:1]]})
    ]
    assert kinds[-1] == "response.completed"
    image = [{"role": "user", "content": [IMAGE]}]
    for bad, words in [
        ({"max_output_tokens": 2}, "input"),
        ({"input": 3}, "input: must be"),
        ({"input": "x", "previous_response_id": "r"}, "previous_response_id"),
        ({"input": image}, "input[0]"),
    ]:
        r = srv.client.post("/v1/responses", json=bad)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_logit_bias_by_token_text(srv) -> None:
    body = {"prompt": "the cat", "n_predict": 6, "ignore_eos": True, "return_tokens": True}
    first = srv.client.post("/completion", json=body).json()
    piece = srv.client.post("/detokenize", json={"tokens": first["tokens"][:1]}).json()["content"]
    ids = srv.client.post("/tokenize", json={"content": piece}).json()["tokens"]
    for bias in ({piece: False}, [[piece, False]]):
        res = srv.client.post("/completion", json={**body, "logit_bias": bias}).json()
        assert not set(ids) & set(res["tokens"])
        shown = res["generation_settings"]["logit_bias"]
        assert [b["token"] for b in shown][: len(ids)] == ids  # then ignore_eos's EOG tokens
        assert all(b["bias"] is None for b in shown)
    r = srv.client.post("/completion", json={**body, "logit_bias": {"": 1}})
    assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"]


def test_aliases_and_tags(srv) -> None:
    (model,) = srv.client.get("/v1/models").json()["data"]
    assert model["id"] == "alpha" and model["aliases"] == ["alpha", "zeta"]
    assert model["tags"] == ["chat", "small"]
    assert srv.client.get("/props").json()["model_alias"] == "alpha"


def test_several_host_addresses() -> None:
    assert parse_server_args(["--host", "127.0.0.1, ::1"]).host == "127.0.0.1,::1"
    try:
        socks = bind_all("127.0.0.1,[::1]", 0)
    except StartupError:
        pytest.skip("no IPv6 loopback")
    try:
        assert [s.family for s in socks] == [socket.AF_INET, socket.AF_INET6]
        assert len({s.getsockname()[1] for s in socks}) == 1
    finally:
        for s in socks:
            s.close()


def prompt(srv, messages, **kw) -> str:
    r = srv.client.post("/apply-template", json={"messages": messages, **kw})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_message_order(srv) -> None:
    user = {"role": "user", "content": "hi"}
    turn = {"role": "assistant", "content": "Whi"}
    asked = prompt(srv, [user])
    assert prompt(srv, [user, turn]) == asked + "Whi"  # prefilled: the answer continues it
    same = prompt(srv, [user, turn], add_generation_prompt=False, continue_final_message=True)
    assert same == asked + "Whi"
    whole = prompt(srv, [user, turn], continue_final_message=False, add_generation_prompt=False)
    assert whole.startswith(asked) and whole != asked + "Whi"
    for body, words in [
        ({"messages": [user, turn, turn]}, "2 or more assistant messages"),
        ({"messages": [user, turn], "continue_final_message": True}, "both add_generation_prompt"),
    ]:
        for path in ("/apply-template", "/v1/chat/completions"):
            r = srv.client.post(path, json=body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_progress_chunks_carry_the_prompt_timings_so_far(srv) -> None:
    """With `timings_per_token` each progress chunk of /completion has `timings`: nothing
    before the first batch, then the prompt tokens computed so far and their time, never
    going back (the suite's test_metrics_timings_on_prompt_progress)."""
    body = {"prompt": LONG[0]["content"], "n_predict": 2, "stream": True, "cache_prompt": False,
            "return_progress": True, "timings_per_token": True}  # fmt: skip
    chunks = [e for e in srv.sse_json("/completion", body) if "prompt_progress" in e]
    first = chunks[0]["timings"]
    assert (first["prompt_n"], first["prompt_ms"], first["predicted_n"]) == (0, 0.0, 0)
    seen = [(c["timings"]["prompt_n"], c["timings"]["prompt_ms"]) for c in chunks]
    assert seen == sorted(seen) and seen[-1][1] > 0
    assert [n for n, _ in seen] == [c["prompt_progress"]["processed"] for c in chunks]
    assert all(v is not None and v >= 0 for c in chunks for v in c["timings"].values())


def test_responses_input_tokens_count_the_rendered_prompt(srv) -> None:
    """`/v1/responses/input_tokens` counts what `/v1/responses` would send: `input` and
    `instructions` as the chat messages they become; bad bodies are 400s."""
    chat = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "hello world"}]}  # fmt: skip
    want = srv.client.post("/v1/chat/completions/input_tokens", json=chat).json()
    for path in ("/v1/responses/input_tokens", "/responses/input_tokens"):
        got = srv.client.post(path, json={"input": "hello world", "instructions": "be brief"})
        assert got.status_code == 200 and got.json() == want
    for body, word in [({}, "input"), ({"input": 3}, "input"), ([1], "JSON object")]:
        r = srv.client.post("/v1/responses/input_tokens", json=body)
        assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
