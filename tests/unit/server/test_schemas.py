"""Request schemas: defaults, aliases, normalization, and errors naming the field."""

from __future__ import annotations

import math

import pytest

from loraserve.server.config.args import parse_server_args
from loraserve.server.schemas import (
    SAMPLING_KEYS,
    ApplyTemplateRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadAdapterRequest,
    LoraScales,
    OAIChatRequest,
    OAICompletionRequest,
    TokenizeRequest,
    UnloadAdapterRequest,
)
from tests.unit.server.schema_util import USER


def test_completion_defaults_are_the_contracts():
    r = CompletionRequest.model_validate({"prompt": "hi"})
    assert r.prompt == ["hi"]
    assert (r.n_predict, r.temperature, r.top_k, r.top_p, r.min_p) == (-1, 0.8, 40, 0.95, 0.05)
    assert (r.repeat_penalty, r.repeat_last_n, r.presence_penalty, r.frequency_penalty) == (
        1.0,
        64,
        0.0,
        0.0,
    )
    assert (r.seed, r.stop, r.stream, r.cache_prompt, r.id_slot, r.n_probs) == (
        -1,
        [],
        False,
        True,
        -1,
        0,
    )
    assert (r.ignore_eos, r.logit_bias, r.return_tokens, r.lora, r.n) == (False, [], False, None, 1)
    assert r.post_sampling_probs is False
    assert r.lora_scales() is None


def test_sampling_kwargs():
    r = CompletionRequest.model_validate(
        {"prompt": "x", "temperature": 0, "seed": 7, "logit_bias": [[5, False], [6, 2]]}
    )
    kw = r.sampling_kwargs()
    assert list(kw) == SAMPLING_KEYS
    assert kw["temperature"] == 0.0 and kw["seed"] == 7
    assert kw["logit_bias"] == ((5, -math.inf), (6, 2.0))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"max_tokens": 5}, 5),
        ({"max_completion_tokens": 6}, 6),
        ({"max_tokens": 5, "n_predict": 7}, 7),
        ({"max_tokens": 5, "max_completion_tokens": 6}, 6),
        ({"n_predict": None, "max_tokens": 5}, 5),
        ({"max_tokens": None}, -1),
    ],
)
def test_n_predict_aliases(body, expected):
    assert CompletionRequest.model_validate({"prompt": "x", **body}).n_predict == expected
    assert OAIChatRequest.model_validate({"messages": USER, **body}).n_predict == expected


def test_nulls_mean_default_and_unknown_fields_are_ignored():
    r = CompletionRequest.model_validate(
        {"prompt": "x", "temperature": None, "stop": None, "mirostat_tau": 5, "samplers": ["k"]}
    )
    assert r.temperature == 0.8 and r.stop == []
    assert r.model_fields_set == {"prompt"}


def test_with_defaults_fills_only_unset_fields():
    cfg = parse_server_args("-n 16 --temp 0.1 --seed 3 --no-cache-prompt --top-k 7".split())
    r = CompletionRequest.model_validate({"prompt": "x", "temperature": 0.9, "max_tokens": 4})
    eff = r.with_defaults(cfg.request_defaults())
    assert (eff.n_predict, eff.temperature, eff.seed, eff.cache_prompt, eff.top_k) == (
        4,
        0.9,
        3,
        False,
        7,
    )
    assert r.seed == -1


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("hi", ["hi"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([1, "x", 2], [[1, "x", 2]]),
        (["a", "b"], ["a", "b"]),
        ([[1, 2], "b", [3, "c"]], [[1, 2], "b", [3, "c"]]),
        ({"prompt_string": "p"}, ["p"]),
        ([{"prompt_string": "p"}, "q"], ["p", "q"]),
        ("", [""]),
    ],
)
def test_prompt_forms(prompt, expected):
    assert CompletionRequest.model_validate({"prompt": prompt}).prompt == expected


def test_stop_and_logit_bias_forms():
    r = CompletionRequest.model_validate({"prompt": "x", "stop": "\n"})
    assert r.stop == ["\n"]
    assert CompletionRequest.model_validate({"prompt": "x", "stop": ["a", "", "b"]}).stop == [
        "a",
        "b",
    ]
    r = CompletionRequest.model_validate({"prompt": "x", "logit_bias": {"15": -1.5, "3": False}})
    assert r.logit_bias == [(15, -1.5), (3, -math.inf)]
    r = CompletionRequest.model_validate({"prompt": "x", "logit_bias": {" the": -2, "7": 1}})
    assert r.logit_bias == [(" the", -2.0), (7, 1.0)]  # a token's text: tokenized per request
    r = CompletionRequest.model_validate({"prompt": "x", "logit_bias": [["42", 1], [" a", False]]})
    assert r.logit_bias == [("42", 1.0), (" a", -math.inf)]  # in pairs a string is text


def test_lora_field():
    r = CompletionRequest.model_validate({"prompt": "x", "lora": [{"id": 1, "scale": 0.5}]})
    assert r.lora_scales() == {1: 0.5}
    assert CompletionRequest.model_validate({"prompt": "x", "lora": []}).lora_scales() is None
    assert [i.id for i in LoraScales.model_validate([{"id": 0, "scale": 1}]).root] == [0]


def test_chat_request():
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    r = OAIChatRequest.model_validate(
        {"messages": msgs, "model": "my-adapter", "stream_options": {"include_usage": True}}
    )
    # parts are kept (checked): the template decides how they show (`chat/messages.py`)
    assert r.messages[1]["content"] == msgs[1]["content"] and r.model == "my-adapter"
    assert r.stream_options is not None and r.stream_options.include_usage
    assert r.n_probs == 0 and r.add_generation_prompt
    assert OAIChatRequest.model_validate({"messages": USER, "logprobs": True}).n_probs == 20
    lp = OAIChatRequest.model_validate({"messages": USER, "logprobs": True, "top_logprobs": 3})
    assert lp.n_probs == 3
    ok = {"messages": USER, "response_format": {"type": "text"}, "tools": []}
    assert OAIChatRequest.model_validate(ok).n == 1


def test_oai_completion_logprobs_is_n_probs():
    assert OAICompletionRequest.model_validate({"prompt": "x", "logprobs": 5}).n_probs == 5
    assert CompletionRequest.model_validate({"prompt": "x", "logprobs": 2}).n_probs == 2


def test_small_request_defaults():
    t = TokenizeRequest.model_validate({})
    assert (t.content, t.add_special, t.parse_special, t.with_pieces) == ("", False, True, False)
    assert TokenizeRequest.model_validate({"content": [1, "a"]}).content == [1, "a"]
    assert DetokenizeRequest.model_validate({}).tokens == []
    load = LoadAdapterRequest.model_validate({"path": "/a"})
    assert (load.path, load.scale, load.name) == ("/a", 0.0, None)  # run-time loads start off
    assert UnloadAdapterRequest.model_validate({"id": 2}).id == 2
    assert ApplyTemplateRequest.model_validate({"messages": USER}).messages == USER
