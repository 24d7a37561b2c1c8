"""Details llama.cpp's own server tests check: /metrics (HELP and TYPE under each sample's
name, Process-Start-Time-Unix, the counters, throughput since the last scrape), generation
rates that leave out the first token, `response_fields`, `--verbose`'s `__verbose`,
`--no-slots`, `/slots` `next_token` as a list, `--sleep-idle-seconds`, and the role-only
first chunk of a chat stream."""

from __future__ import annotations

import time

import pytest

from tests.server_util import serve_in_thread

ARGS = ["-np", "1", "-c", "256", "--temp", "0"]


@pytest.fixture(scope="module")
def srv():
    with serve_in_thread([*ARGS, "--metrics", "-v", "--sleep-idle-seconds", "1"]) as s:
        yield s


def parse(text: str) -> dict[str, tuple[str, float]]:
    types, out = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#") and "{" not in line:
            name, value = line.split(" ", 1)
            assert name in types, f"{name} has no # TYPE line"
            assert f"# HELP {name} " in text
            out[name] = (types[name], float(value))
    return out


def scrape(srv) -> tuple[str, dict[str, tuple[str, float]]]:
    r = srv.client.get("/metrics")
    assert r.status_code == 200 and int(r.headers["Process-Start-Time-Unix"]) > 0
    assert b"Process-Start-Time-Unix" in {name for name, _ in r.headers.raw}
    return r.text, parse(r.text)


def complete(srv, **body) -> dict:
    r = srv.client.post("/completion", json={"prompt": "I believe", "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_metrics_as_llama_server(srv) -> None:
    _, before = scrape(srv)
    runs = [complete(srv, n_predict=n) for n in (1, 4)]
    again = complete(srv, n_predict=4)  # same prompt: cached
    _, m = scrape(srv)
    for name in (
        "prompt_tokens_total prompt_tokens_cached_total prompt_seconds_total"
        " tokens_predicted_total tokens_predicted_seconds_total n_decode_total n_tokens_max"
        " spec_decode_num_draft_tokens_total spec_decode_num_accepted_tokens_total"
        " spec_decode_num_drafts_total"
    ).split():
        assert m[f"llamacpp:{name}"][0] == "counter", name
    for name in (
        "prompt_tokens_seconds predicted_tokens_seconds requests_processing requests_deferred"
        " n_busy_slots_per_decode"
    ).split():
        assert m[f"llamacpp:{name}"][0] == "gauge", name

    def delta(k: str) -> float:
        return m[k][1] - before.get(k, ("", 0.0))[1]

    done = [*runs, again]
    assert delta("llamacpp:tokens_predicted_total") == sum(
        r["timings"]["predicted_n"] for r in done
    )
    assert delta("llamacpp:prompt_tokens_total") == sum(r["timings"]["prompt_n"] for r in done)
    assert delta("llamacpp:prompt_tokens_cached_total") == sum(
        r["timings"]["cache_n"] for r in done
    )
    assert again["timings"]["cache_n"] > 0 and delta("llamacpp:n_decode_total") > 0
    assert m["llamacpp:n_tokens_max"][1] >= again["tokens_evaluated"] + 4
    assert m["llamacpp:requests_processing"][1] == 0
    assert m["llamacpp:predicted_tokens_seconds"][1] > 0
    _, after = scrape(srv)  # the throughput window starts again at each scrape
    assert after["llamacpp:predicted_tokens_seconds"][1] == 0


def test_generation_rate_leaves_out_the_first_token(srv) -> None:
    one = complete(srv, n_predict=1)["timings"]
    assert one["predicted_n"] == 1 and one["predicted_per_second"] == 0.0
    assert one["predicted_per_token_ms"] == 0.0
    many = complete(srv, n_predict=8)["timings"]
    assert many["predicted_per_second"] == pytest.approx(1e3 / many["predicted_ms"] * 7)


def test_response_fields(srv) -> None:
    res = complete(srv, n_predict=3, response_fields=["content", "generation_settings/n_predict"])
    assert set(res) == {"content", "generation_settings/n_predict"}
    assert res["generation_settings/n_predict"] == 3
    assert "timings" in complete(srv, n_predict=1, response_fields=[])
    assert complete(srv, n_predict=1, response_fields=["nope/x"]) == {}
    r = srv.client.post("/completion", json={"prompt": "a", "response_fields": "content"})
    assert r.status_code == 400 and "response_fields" in r.json()["error"]["message"]


def test_verbose_adds_the_native_result(srv) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    res = srv.client.post("/v1/chat/completions", json=body).json()
    assert res["__verbose"]["prompt"].endswith("assistant\n") and "content" in res["__verbose"]
    res = srv.client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).json()
    assert res["__verbose"]["tokens_predicted"] <= 2
    with serve_in_thread(ARGS) as quiet:
        assert "__verbose" not in quiet.client.post("/v1/chat/completions", json=body).json()
        asked = quiet.client.post("/v1/chat/completions", json={**body, "verbose": True}).json()
        assert "hi" in asked["__verbose"]["prompt"]


def test_chat_input_tokens_count_the_rendered_prompt(srv) -> None:
    body = {"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "hi"}]}
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        res = srv.client.post(path, json=body).json()
        assert res["object"] == "response.input_tokens"
        chat = srv.client.post("/v1/chat/completions", json={**body, "max_tokens": 1}).json()
        assert res["input_tokens"] == chat["usage"]["prompt_tokens"]
    r = srv.client.post("/chat/completions/input_tokens", json={"messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


def test_chat_stream_starts_with_a_role_only_chunk(srv) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    chunks = [c for c in srv.sse_json("/v1/chat/completions", body) if c["choices"]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_slots_next_token_is_a_list_and_no_slots_is_501(srv) -> None:
    complete(srv, n_predict=2)
    (slot,) = srv.client.get("/slots").json()
    assert slot["next_token"] == [{"has_next_token": False, "n_remain": -1, "n_decoded": 0}]
    with serve_in_thread([*ARGS, "--no-slots"]) as s:
        r = s.client.get("/slots")
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        assert s.client.get("/props").json()["endpoint_slots"] is False


def test_sleep_after_idle_seconds(srv) -> None:
    def sleeping() -> bool:
        return srv.client.get("/props").json()["is_sleeping"]

    complete(srv, n_predict=1)
    assert not sleeping()
    deadline = time.monotonic() + 10
    while not sleeping():
        assert time.monotonic() < deadline, "never went to sleep"
        time.sleep(0.1)
    scrape(srv)  # the first scrape takes the last generation's throughput
    text, _ = scrape(srv)  # read-only requests do not wake it, nor change the metrics
    assert srv.client.get("/health").status_code == 200 and sleeping()
    assert scrape(srv)[0] == text
    assert srv.client.post("/tokenize", json={"content": "x"}).status_code == 200
    assert not sleeping()
    with serve_in_thread(ARGS) as s:
        time.sleep(1.2)
        assert s.client.get("/props").json()["is_sleeping"] is False


def test_generation_settings_logit_bias_as_llama_server(srv) -> None:
    settings = complete(srv, n_predict=1, ignore_eos=True)["generation_settings"]
    assert settings["logit_bias"] and all(e["bias"] is None for e in settings["logit_bias"])
    settings = complete(srv, n_predict=1, ignore_eos=False, logit_bias=[[5, 1.5]])
    assert settings["generation_settings"]["logit_bias"] == [{"bias": 1.5, "token": 5}]
