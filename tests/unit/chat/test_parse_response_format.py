"""Response-format answers (a request with `json_schema` / `response_format`) against
llama.cpp's own parses (tests/data/chat/parse_cases.json): the JSON is the content, a
```json fence around it unwrapped and the reasoning before it split off, whole and fed one
character at a time (the deltas add up to the whole message)."""

from __future__ import annotations

import pytest

from loraserve.chat.formats.stream import MessageStream
from tests.unit.chat.oracle_util import CASES, case_parser, norm_message, parsed_message

PENDING = {"Cohere2MoE.jinja", "muse-glimmer.jinja"}  # specialised formats not ported yet
RF_CASES = [
    c for c in CASES if c["request"].get("json_schema") is not None and c["template"] not in PENDING
]


def _with_rf(case: dict):  # noqa: ANN202
    parser = case_parser(case)
    parser.response_format = True
    return parser


@pytest.mark.parametrize("case", RF_CASES, ids=[f"{c['id']}-{c['template']}" for c in RF_CASES])
def test_response_format_parses_equal_llama_cpps(case: dict) -> None:
    mine = parsed_message(_with_rf(case), case["input"], case["is_partial"])
    assert norm_message(mine) == norm_message(case["expect"])


@pytest.mark.parametrize("case", RF_CASES, ids=[f"{c['id']}-{c['template']}" for c in RF_CASES])
def test_response_format_streams_add_up(case: dict) -> None:
    stream = MessageStream(_with_rf(case))
    deltas = [d for ch in case["input"] for d in stream.feed(ch)] + stream.finish()
    assert stream.final is not None
    assert "".join(d.get("content", "") for d in deltas) == stream.final.content
    assert "".join(d.get("reasoning_content", "") for d in deltas) == (
        stream.final.reasoning_content
    )
