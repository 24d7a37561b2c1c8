"""Constrained generation over HTTP (GBNF `grammar`, `json_schema`, OpenAI `response_format`)
on the tiny model: every finished answer parses and satisfies its grammar or schema (the
`jsonschema` package is the oracle), also for random schemas of bounded size (hypothesis),
under a LoRA mix and sampled; invalid grammars and schemas are a 400 naming the field."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server_util import peft_folder, serve_in_thread


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    adapter = peft_folder(tmp_path_factory.mktemp("g") / "a", 5, magnitude=1.0)
    args = ["-np", "2", "-c", "1024", "--lora-scaled", f"{adapter}:0"]
    with serve_in_thread(args) as s:
        yield s


def complete(srv, path: str = "/completion", **body) -> dict:
    body = {"prompt": "the cat", "n_predict": 200, **body}
    r = srv.client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_gbnf_exact(srv) -> None:
    res = complete(srv, grammar='root ::= "a"{5,5}', n_predict=10)
    assert res["content"] == "aaaaa" and res["stop_type"] == "eos"


def test_gbnf_alternatives_and_repetition(srv) -> None:
    grammar = 'root ::= ("yes" | "no") " " [0-9]{1,3} ("," [a-z]+)*\n'
    for seed in range(4):
        res = complete(srv, grammar=grammar, n_predict=40, seed=seed, temperature=1.0)
        if res["stop_type"] != "limit":
            assert re.fullmatch(r"(yes|no) [0-9]{1,3}(,[a-z]+)*", res["content"]), res["content"]


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


def test_json_schema_on_every_endpoint(srv) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
    answers = [
        complete(srv, json_schema=SCHEMA)["content"],
        complete(srv, "/v1/completions", json_schema=SCHEMA)["choices"][0]["text"],
        complete(srv, "/v1/chat/completions", **chat, json_schema=SCHEMA),
        complete(
            srv,
            "/v1/chat/completions",
            **chat,
            response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}},
        ),
        complete(
            srv,
            "/v1/chat/completions",
            **chat,
            response_format={"type": "json_object", "schema": SCHEMA},
        ),
        complete(srv, json_schema=SCHEMA, lora=[{"id": 0, "scale": 1.0}])["content"],
    ]
    for a in answers:
        text = a if isinstance(a, str) else a["choices"][0]["message"]["content"]
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_and_text_formats(srv) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 300}
    res = complete(srv, "/v1/chat/completions", **chat, response_format={"type": "json_object"})
    if res["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(res["choices"][0]["message"]["content"]), dict)
    plain = complete(srv, "/v1/chat/completions", **chat, response_format={"type": "text"})
    assert plain["choices"][0]["message"]["content"] is not None


def test_streamed_answer_parses(srv) -> None:
    events = srv.sse_json(
        "/completion", {"prompt": "x", "n_predict": 200, "json_schema": SCHEMA, "stream": True}
    )
    text = "".join(e["content"] for e in events if not e["stop"])
    jsonschema.validate(json.loads(text + events[-1]["content"]), SCHEMA)


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"grammar": "root ::= this is (not valid GBNF"}, "grammar"),
        ({"grammar": "root ::= other"}, "grammar"),
        ({"json_schema": {"type": "hiccup"}}, "json_schema"),
        ({"json_schema": {"type": 123}}, "json_schema"),
        ({"json_schema": 123}, "json_schema"),
        ({"json_schema": {"type": "string"}, "grammar": 'root ::= "a"'}, "not both"),
        ({"response_format": {"type": "sound"}}, "response_format"),
        ({"response_format": {"type": "json_object", "schema": 123}}, "response_format"),
        (
            {"response_format": {"type": "json_object", "schema": {"type": "hiccup"}}},
            "response_format",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
    ],
)
def test_invalid_constraints_are_400(srv, body, needle) -> None:
    for path, extra in (
        ("/completion", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ):
        r = srv.client.post(path, json={**extra, **body, "n_predict": 4})
        assert r.status_code == 400, (path, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and needle in err["message"], err
    assert srv.client.get("/health").status_code == 200


leaf = st.one_of(
    st.just({"type": "boolean"}),
    st.builds(
        lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n},
        st.integers(-50, 50),
        st.integers(0, 200),
    ),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=1, max_size=3, unique=True).map(
        lambda v: {"enum": v}
    ),
    st.just({"type": "null"}),
)


def _object(props: dict) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
    }


schemas = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda items, n: {"type": "array", "items": items, "maxItems": n},
            inner,
            st.integers(0, 3),
        ),
        st.dictionaries(
            st.text("abcde", min_size=1, max_size=3), inner, min_size=1, max_size=3
        ).map(_object),
    ),
    max_leaves=6,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, seed=st.integers(0, 2**16), temperature=st.sampled_from([0.0, 1.0]))
def test_random_schemas_always_parse(srv, schema, seed, temperature) -> None:
    res = complete(srv, json_schema=schema, n_predict=400, seed=seed, temperature=temperature)
    assert res["stop_type"] in ("eos", "limit"), res
    if res["stop_type"] == "eos":
        jsonschema.validate(json.loads(res["content"]), schema)
