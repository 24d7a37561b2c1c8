"""Tool calling over HTTP: two tools with bounded schemas (a random model writes digits
until the token limit where a schema leaves a value open), one user turn, and the requests
and checks the tool-call tests share (`jsonschema` validates every complete call)."""

from __future__ import annotations

import json

import jsonschema
import pytest

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["a", "b"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
N_PREDICT = 480  # JSON spaced as llama.cpp allows: a random model may indent every gap
USER = [{"role": "user", "content": "Weather in Paris for 3 days?"}]


def chat(srv, **body) -> dict:
    body = {"messages": USER, "tools": TOOLS, "n_predict": N_PREDICT, "temperature": 0, **body}
    r = srv.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def chat_stream(srv, **body) -> tuple[dict, str]:
    """The streamed answer assembled from its deltas, and the finish reason."""
    body = {"messages": USER, "tools": TOOLS, "n_predict": N_PREDICT, "temperature": 0, **body}
    msg: dict = {"content": "", "reasoning_content": "", "tool_calls": {}}
    finish = None
    with srv.client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                d = choice["delta"]
                msg["content"] += d.get("content") or ""
                msg["reasoning_content"] += d.get("reasoning_content") or ""
                for c in d.get("tool_calls", []):
                    call = msg["tool_calls"].setdefault(c["index"], {"arguments": ""})
                    if "id" in c:
                        assert "id" not in call, "index, id, type and name come once, first"
                        call.update(id=c["id"], name=c["function"]["name"], type=c["type"])
                    call["arguments"] += c["function"].get("arguments", "")
                finish = choice["finish_reason"] or finish
    return msg, finish


def check_calls(choice: dict) -> list[dict]:
    """The complete calls of an answer, each valid for its tool's schema. An answer the
    token limit cut (`length`: the random model writes parallel calls until then) ends in
    the cut call, its arguments so far (as OpenAI's): that one is left out."""
    calls = choice["message"].get("tool_calls") or []
    assert choice["finish_reason"] in ("tool_calls", "length") or not calls, choice
    complete = calls[:-1] if choice["finish_reason"] == "length" else calls
    for c in complete:
        assert c["type"] == "function" and c["id"]
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    return complete


def openai_second_turn(srv, max_tokens: int, render: bool = False) -> None:
    """The official `openai` client: a required call (its arguments valid under the tool's
    schema) goes back into the history, as the client's own message object, with the tool's
    result, and the second turn finishes; with ``render`` the template renders that history
    (/apply-template) with the call in the prompt. Skips where `openai` is not installed."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x")
    first = client.chat.completions.create(
        model="m", messages=USER, tools=TOOLS, tool_choice="required", max_tokens=max_tokens,
        temperature=0, parallel_tool_calls=False,
    )  # fmt: skip
    call = first.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    history = [
        *USER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
    ]
    if render:
        r = srv.client.post("/apply-template", json={"messages": history, "tools": TOOLS})
        assert r.status_code == 200, r.text
        assert '"temp": 21' in r.json()["prompt"] or "temp" in r.json()["prompt"]
    second = client.chat.completions.create(
        model="m", messages=history, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
