"""`--skip-chat-parsing` with an assistant prefill, against llama-server's recorded answers
(tests/data/chat/skip_parsing_server.json, scripts/chat_oracle/record_skip_parsing.py: the
peer's llama-server on Gemma 3 270M with Qwen3's template).

llama-server's forced pure-content render drops the continued message: the messages before it
are rendered with no generation prompt, and the answer's content is the generated text alone.
Without the flag the same requests prefill as usual. The prompts are byte-equal here on the
tiny model (Qwen3's template reads neither BOS nor the date), the prompt the answer is
generated from is the one /apply-template shows, and the content holds no prefill."""

from __future__ import annotations

import json

import pytest

from tests.server_util import serve_in_thread
from tests.unit.chat.format_util import DATA, TEMPLATES

ORACLE = json.loads((DATA / "skip_parsing_server.json").read_text())
TEMPLATE = str(TEMPLATES / ORACLE["meta"]["template"])


@pytest.fixture(scope="module", params=["skip_chat_parsing", "parsing"])
def srv(request):
    flags = ["--skip-chat-parsing"] if request.param == "skip_chat_parsing" else []
    with serve_in_thread(["-np", "1", "-c", "1024", "--chat-template-file", TEMPLATE, *flags]) as s:
        yield request.param, s


@pytest.mark.parametrize("name", sorted(ORACLE["requests"]))
def test_prompt_and_answer_as_llama_server(srv, name: str) -> None:
    mode, s = srv
    body = ORACLE["requests"][name]
    want = ORACLE[mode][name]
    prompt = s.client.post("/apply-template", json=body).json()["prompt"]
    assert prompt == want["prompt"]
    r = s.client.post("/v1/chat/completions", json={**body, "n_predict": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    answer = r.json()
    tokens = s.client.post("/tokenize", json={"content": prompt, "add_special": True}).json()
    assert answer["usage"]["prompt_tokens"] == len(tokens["tokens"])
    msg = answer["choices"][0]["message"]
    prefill = body["messages"][-1]
    if mode == "skip_chat_parsing":  # everything is content, none of it prefilled
        assert not msg.get("reasoning_content") and not msg.get("tool_calls")
        assert not msg["content"].startswith(prefill["content"] or "\0")
    elif prefill["role"] == "assistant":  # the prefill leads its part of the answer
        assert want["answer"]["message"]["content"].startswith(prefill["content"])
        assert msg["content"].startswith(prefill["content"])
        if prefill.get("reasoning_content"):
            assert msg["reasoning_content"].startswith(prefill["reasoning_content"])
