"""Request schemas under bad input: every error names its field (a table of bad bodies),
and any JSON at all either validates or fails with a message, never an exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from loraserve.server.errors import validation_message
from loraserve.server.fields import MAX_LOGIT_BIAS, MAX_STOP, MAX_STOP_LEN
from loraserve.server.schemas import (
    N_PROBS_MAX,
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
from tests.unit.server.schema_util import USER, error_of


@pytest.mark.parametrize(
    ("model", "body", "needle"),
    [
        (CompletionRequest, {}, "prompt: Field required"),
        (CompletionRequest, [1, 2], "request body must be a JSON object"),
        (CompletionRequest, {"prompt": 5}, "prompt: expected a string"),
        (CompletionRequest, {"prompt": []}, "prompt: must not be empty"),
        (CompletionRequest, {"prompt": [[]]}, "prompt[0]: must not be empty"),
        (CompletionRequest, {"prompt": [1, -2]}, "prompt[1]: expected a token id"),
        (CompletionRequest, {"prompt": [1, True]}, "prompt[1]: expected a token id"),
        (CompletionRequest, {"prompt": ["a", [1, 2.5]]}, "prompt[1][1]: expected a token id"),
        (CompletionRequest, {"prompt": ["a", {"x": 1}]}, "prompt[1]: expected a string"),
        (
            CompletionRequest,
            {"prompt": {"prompt_string": "p", "multimodal_data": ["AA=="]}},
            "prompt: multimodal_data is not supported",
        ),
        (
            CompletionRequest,
            {"prompt": "x", "n_predict": "5"},
            "n_predict: Input should be a valid",
        ),
        (
            CompletionRequest,
            {"prompt": "x", "max_tokens": -2},
            "max_tokens: Input should be greater",
        ),
        (CompletionRequest, {"prompt": "x", "n_predict": 2.5}, "n_predict:"),
        (CompletionRequest, {"prompt": "x", "temperature": -0.1}, "temperature:"),
        (CompletionRequest, {"prompt": "x", "temperature": "hot"}, "temperature:"),
        (CompletionRequest, {"prompt": "x", "top_p": 1.01}, "top_p:"),
        (CompletionRequest, {"prompt": "x", "min_p": -0.5}, "min_p:"),
        (CompletionRequest, {"prompt": "x", "repeat_penalty": 0}, "repeat_penalty:"),
        (CompletionRequest, {"prompt": "x", "repeat_last_n": -1}, "repeat_last_n:"),
        (CompletionRequest, {"prompt": "x", "seed": -2}, "seed:"),
        (CompletionRequest, {"prompt": "x", "seed": 2**32}, "seed:"),
        (CompletionRequest, {"prompt": "x", "id_slot": -5}, "id_slot:"),
        (CompletionRequest, {"prompt": "x", "n_probs": N_PROBS_MAX + 1}, "n_probs:"),
        (CompletionRequest, {"prompt": "x", "logprobs": -1}, "logprobs:"),
        (
            CompletionRequest,
            {"prompt": "x", "stream": 1},
            "stream: Input should be a valid boolean",
        ),
        (CompletionRequest, {"prompt": "x", "stream": "true"}, "stream:"),
        (CompletionRequest, {"prompt": "x", "cache_prompt": "no"}, "cache_prompt:"),
        (CompletionRequest, {"prompt": "x", "stop": 5}, "stop: must be a string or a list"),
        (CompletionRequest, {"prompt": "x", "stop": ["a", 1]}, "stop: must be a string or a list"),
        (CompletionRequest, {"prompt": "x", "stop": ["s"] * (MAX_STOP + 1)}, "stop: at most"),
        (CompletionRequest, {"prompt": "x", "stop": "s" * (MAX_STOP_LEN + 1)}, "stop: each"),
        (CompletionRequest, {"prompt": "x", "logit_bias": 3}, "logit_bias: expected"),
        (CompletionRequest, {"prompt": "x", "logit_bias": [[1]]}, "logit_bias[0]: expected a"),
        (CompletionRequest, {"prompt": "x", "logit_bias": [[1, True]]}, "logit_bias[0]: bias"),
        (CompletionRequest, {"prompt": "x", "logit_bias": [[1, "x"]]}, "logit_bias[0]: bias"),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": [["", 1]]},
            "logit_bias[0]: the token text is empty",
        ),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": [[-1, 1]]},
            "logit_bias[0]: expected a tok",
        ),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": {"-1": 1}},
            "logit_bias['-1']: expected a token id",
        ),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": {"": 1}},
            "logit_bias['']: the token text is empty",
        ),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": [[1, 0]] * (MAX_LOGIT_BIAS + 1)},
            "logit_bias: at most",
        ),
        (
            CompletionRequest,
            {"prompt": "x", "lora": {"id": 0}},
            "lora: Input should be a valid list",
        ),
        (CompletionRequest, {"prompt": "x", "lora": [{"id": 0}]}, "lora[0].scale: Field required"),
        (CompletionRequest, {"prompt": "x", "lora": [{"id": "0", "scale": 1}]}, "lora[0].id:"),
        (CompletionRequest, {"prompt": "x", "lora": [{"id": 0, "scale": "1"}]}, "lora[0].scale:"),
        (CompletionRequest, {"prompt": "x", "lora": [{"id": -1, "scale": 1}]}, "lora[0].id:"),
        (
            CompletionRequest,
            {"prompt": "x", "lora": [{"id": 0, "scale": 1}, {"id": 0, "scale": 0}]},
            "lora[1].id: adapter 0 is listed twice",
        ),
        (CompletionRequest, {"prompt": "x", "n": 0}, "n"),
        (CompletionRequest, {"prompt": "x", "grammar": 5}, "grammar:"),
        (CompletionRequest, {"prompt": "x", "json_schema": "x"}, "json_schema:"),
        (CompletionRequest, {"prompt": "x", "response_fields": "content"}, "response_fields:"),
        (OAICompletionRequest, {"prompt": "x", "echo": True}, "echo: echo is not supported"),
        (OAICompletionRequest, {"prompt": "x", "best_of": 2}, "best_of:"),
        (OAICompletionRequest, {"prompt": "x", "model": 3}, "model:"),
        (OAICompletionRequest, {"prompt": "x", "stream_options": 1}, "stream_options:"),
        (OAIChatRequest, {}, "messages: Field required"),
        (OAIChatRequest, {"messages": []}, "messages: List should have at least 1 item"),
        (OAIChatRequest, {"messages": "hi"}, "messages: Input should be a valid list"),
        (OAIChatRequest, {"messages": [{"role": 1, "content": "x"}]}, "messages[0].role:"),
        (OAIChatRequest, {"messages": [{"role": "user"}]}, "messages[0].content: missing"),
        (
            OAIChatRequest,
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]: unsupported content part type 'image_url'",
        ),
        (OAIChatRequest, {"messages": USER, "n": -1}, "n"),
        (OAIChatRequest, {"messages": USER, "top_logprobs": 2}, "top_logprobs requires logprobs"),
        (OAIChatRequest, {"messages": USER, "logprobs": 5}, "logprobs: Input should be a valid b"),
        (
            OAIChatRequest,
            {"messages": USER, "tools": [{"type": "function"}]},
            "tools[0]: must be",
        ),
        (
            OAIChatRequest,
            {"messages": USER, "response_format": "json"},
            "response_format:",
        ),
        (ApplyTemplateRequest, {"messages": [{"content": "x"}]}, "messages[0].role: missing"),
        (LoraScales, {"id": 0, "scale": 1}, "request body must be a JSON array of"),
        (LoraScales, [{"id": 0, "scale": True}], "[0].scale: Input should be a valid number"),
        (LoraScales, [{"id": 0, "scale": 1}, {"id": 0, "scale": 1}], "[1].id: adapter 0 is listed"),
        (LoadAdapterRequest, {}, "path: Field required"),
        (LoadAdapterRequest, {"path": ""}, "path: String should have at least 1 character"),
        (LoadAdapterRequest, {"path": "a", "scale": "x"}, "scale:"),
        (LoadAdapterRequest, {"path": "a", "name": 5}, "name:"),
        (UnloadAdapterRequest, {"id": "1"}, "id: Input should be a valid integer"),
        (TokenizeRequest, {"content": 5}, "content: expected a string"),
        (TokenizeRequest, {"content": "x", "add_special": "yes"}, "add_special:"),
        (DetokenizeRequest, {"tokens": [1, "a"]}, "tokens[1]: expected a token id"),
        (DetokenizeRequest, {"tokens": "12"}, "tokens: expected a list of token ids"),
    ],
)
def test_every_bad_input_names_its_field(model, body, needle):
    assert needle in error_of(model, body)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = sorted(CompletionRequest.model_fields) + ["max_tokens", "logprobs", "messages"]


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6))
def test_any_json_validates_or_fails_cleanly(body):
    for model in (CompletionRequest, OAIChatRequest):
        try:
            model.model_validate(body)
        except ValidationError as exc:
            assert validation_message(exc.errors())
