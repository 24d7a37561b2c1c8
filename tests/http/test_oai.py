"""The OpenAI API: the official `openai` client against /v1, SSE framing, usage, logprobs."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server_util import serve_in_thread

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"}]


@pytest.fixture(scope="module")
def srv():
    with serve_in_thread(["-np", "2", "-c", "512", "--temp", "0"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def native(srv, prompt: str, n: int) -> dict:
    body = {"prompt": prompt, "n_predict": n, "ignore_eos": True}
    return srv.client.post("/completion", json=body).json()


def test_openai_completions(srv, client) -> None:
    res = client.completions.create(
        model="anything", prompt="the cat and", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert res.object == "text_completion" and res.model == "tiny.gguf"  # the real name
    (choice,) = res.choices
    assert choice.text == native(srv, "the cat and", 5)["content"]
    assert choice.finish_reason == "length" and choice.index == 0
    assert res.usage.completion_tokens == 5 and res.usage.total_tokens > 5


def test_openai_completions_stream(srv, client) -> None:
    chunks = list(
        client.completions.create(
            model="m",
            prompt="the cat and",
            max_tokens=5,
            stream=True,
            extra_body={"ignore_eos": True},
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == native(srv, "the cat and", 5)["content"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_openai_chat(srv, client) -> None:
    res = client.chat.completions.create(model="m", messages=MSGS, max_tokens=4)
    assert res.object == "chat.completion"
    msg = res.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    prompt = srv.client.post("/apply-template", json={"messages": MSGS}).json()["prompt"]
    assert (
        msg.content
        == srv.client.post("/completion", json={"prompt": prompt, "n_predict": 4}).json()["content"]
    )
    assert res.usage.prompt_tokens == res.timings["prompt_n"] + res.timings["cache_n"]  # type: ignore[attr-defined]


def test_openai_chat_stream(client) -> None:
    plain = client.chat.completions.create(model="m", messages=MSGS, max_tokens=6)
    chunks = list(
        client.chat.completions.create(model="m", messages=MSGS, max_tokens=6, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_openai_models(srv, client) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "tiny.gguf"


def test_openai_errors_raise_typed_exceptions(client) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="a", max_tokens=-5)
    assert e.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_sse_framing_ends_with_done(srv) -> None:
    for path, body in (
        ("/v1/completions", {"prompt": "the", "max_tokens": 3}),
        ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 3}),
    ):
        events = srv.sse(path, {**body, "stream": True})
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        parsed = [json.loads(e) for e in events[:-1]]
        assert all(
            p["object"].endswith("chunk") or p["object"] == "text_completion" for p in parsed
        )
        assert len({p["id"] for p in parsed}) == 1
        assert parsed[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    # as llama-server, a chat stream's last chunk carries the timings (and the slot)
    body = {"messages": MSGS, "max_tokens": 3, "stream": True}
    last = json.loads(srv.sse("/v1/chat/completions", body)[-2])
    assert last["choices"][0]["finish_reason"] is not None
    assert 1 <= last["timings"]["predicted_n"] <= 3 and last["timings"]["prompt_n"] > 0
    assert last["id_slot"] >= 0


def test_logprobs(srv) -> None:
    res = srv.client.post(
        "/v1/completions", json={"prompt": "the", "max_tokens": 3, "logprobs": 2}
    ).json()
    lp = res["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    chat = srv.client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "max_tokens": 2, "logprobs": True, "top_logprobs": 3},
    ).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 2 and len(content[0]["top_logprobs"]) == 3
    assert {"token", "logprob", "bytes"} <= content[0].keys()


def test_multiple_prompts_give_one_choice_each(srv) -> None:
    res = srv.client.post(
        "/v1/completions", json={"prompt": ["the", "a cat"], "max_tokens": 3, "ignore_eos": True}
    ).json()
    assert [c["index"] for c in res["choices"]] == [0, 1]
    assert res["choices"][1]["text"] == native(srv, "a cat", 3)["content"]


def test_n_choices_share_one_prefill_and_seed_apart(srv, client) -> None:
    res = client.chat.completions.create(model="x", messages=MSGS, max_tokens=6, n=2)
    assert [c.index for c in res.choices] == [0, 1]
    assert res.choices[0].message.content == res.choices[1].message.content  # greedy
    single = client.chat.completions.create(model="x", messages=MSGS, max_tokens=6)
    assert res.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    assert res.usage.completion_tokens == 2 * single.usage.completion_tokens
    body = {"prompt": "the cat sat on the mat and", "n_predict": 4, "cache_prompt": False}
    lead, child = srv.client.post("/completion", json={**body, "n": 2}).json()
    n_prompt = lead["tokens_evaluated"]
    assert lead["timings"]["prompt_n"] == n_prompt and lead["timings"]["cache_n"] == 0
    assert child["timings"]["prompt_n"] == 1 and child["timings"]["cache_n"] == n_prompt - 1
    assert child["content"] == lead["content"]
    sampled = {**body, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 42}
    pair = srv.client.post("/completion", json={**sampled, "n": 2}).json()
    alone = [
        srv.client.post("/completion", json={**sampled, "seed": 42 + j}).json() for j in (0, 1)
    ]
    assert [p["content"] for p in pair] == [a["content"] for a in alone]
    r = srv.client.post("/v1/completions", json={"prompt": "a", "n": 3})
    assert r.status_code == 400 and "n: at most 2" in r.json()["error"]["message"]


def test_n_choices_stream(srv) -> None:
    body = {"messages": MSGS, "max_tokens": 3, "n": 2, "stream": True}
    chunks = srv.sse_json("/v1/chat/completions", body)
    by_index: dict[int, list] = {0: [], 1: []}
    for c in chunks:
        for choice in c["choices"]:
            by_index[choice["index"]].append(choice)
    for choices in by_index.values():
        assert choices[0]["delta"]["role"] == "assistant"
        assert choices[-1]["finish_reason"] in ("length", "stop")
    text = srv.client.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2}).json()
    assert [c["index"] for c in text["choices"]] == [0, 1, 2, 3]


TOOLS_TEMPLATE = (
    "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}"
)
PYTHON_TOOL = {"type": "function", "function": {"name": "python", "parameters": {}}}


def test_chat_tools_with_tool_choice_none_reach_the_template() -> None:
    """`tools` with `tool_choice: none` are rendered by the template and the answer is text
    (llama-server's suite: test_completion_without_tool_call_fast); this template has no
    tool-call format, so `auto` answers text and `required` a bare JSON call; malformed
    tools are 400s naming the field."""
    with serve_in_thread(["--chat-template", TOOLS_TEMPLATE, "-np", "1"]) as s:

        def chat(content: str, **kw) -> dict:
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4,
                    "temperature": 0, **kw}  # fmt: skip
            return s.client.post("/v1/chat/completions", json=body)

        with_tools = chat("hi", tools=[PYTHON_TOOL], tool_choice="none")
        assert with_tools.status_code == 200, with_tools.text
        message = with_tools.json()["choices"][0]["message"]
        assert message.get("tool_calls") is None
        rewritten = chat("[python]hi").json()  # the prompt the template made
        assert message["content"] == rewritten["choices"][0]["message"]["content"]
        assert with_tools.json()["usage"]["prompt_tokens"] == rewritten["usage"]["prompt_tokens"]
        assert chat("hi").json()["usage"]["prompt_tokens"] < rewritten["usage"]["prompt_tokens"]
        auto = chat("hi", tools=[PYTHON_TOOL]).json()["choices"][0]
        assert auto["message"].get("tool_calls") is None and auto["finish_reason"] == "length"
        bounded = {"type": "function", "function": {"name": "python", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "maximum": 9,
            "minimum": 0}}, "required": ["n"]}}}  # fmt: skip
        forced = chat("hi", tools=[bounded], tool_choice="required", max_tokens=64).json()
        calls = forced["choices"][0]["message"].get("tool_calls") or []
        assert calls and all(c["function"]["name"] == "python" for c in calls), forced
        for kw, word in [
            ({"tools": [{"type": "function"}], "tool_choice": "none"}, "tools[0]"),
            (
                {"tools": [{"type": "function", "function": {}}], "tool_choice": "none"},
                "tools[0].function.name",
            ),  # fmt: skip
            ({"tool_choice": "sometimes"}, "tool_choice"),
        ]:
            r = chat("hi", **kw)
            assert r.status_code == 400 and word in r.json()["error"]["message"], (kw, r.text)
