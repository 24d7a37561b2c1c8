"""The Jinja environment against llama.cpp's own engine: every case of the peer's
tests/test-jinja.cpp (whitespace control, undefined values, filters, tests, string, array and
object methods, macros, namespaces) and the cases of ours where jinja2's semantics differ
from llama.cpp's (undefined and none joined to strings, attribute chains on undefined,
loops over undefined, how values print, `string`/`safe`/`tojson`, filters answering lists,
list methods), rendered as llama.cpp's engine rendered them (tests/data/chat/jinja_cases.json,
recorded by scripts/chat_oracle/record_jinja.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraserve.chat.jinja_env import compile_template, render_source

CASES = json.loads(
    (Path(__file__).resolve().parents[2] / "data" / "chat" / "jinja_cases.json").read_text()
)["cases"]


def test_the_data_has_llama_cpps_cases_and_ours() -> None:
    ours = [c for c in CASES if c["name"].startswith("ours: ")]
    assert len(CASES) - len(ours) >= 290 and len(ours) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_renders_as_llama_cpps_engine(case: dict) -> None:
    template = compile_template(case["template"])
    if "error" in case:
        with pytest.raises(ValueError):
            render_source(template, dict(case["vars"]))
    else:
        assert render_source(template, dict(case["vars"])) == case["rendered"]
