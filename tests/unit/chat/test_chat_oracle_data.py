"""The recorded llama.cpp chat oracle (tests/data/chat/, scripts/chat_oracle/) is whole and
well-formed: every template has an answer for every case, every index resolves, every
recorded stream ends in the whole parse and only grows, as llama.cpp's own test requires.
The comparisons with loraserve live beside the code they test; this checks only the data."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "data" / "chat"
TEMPLATES = DATA / "templates"
ROLES = {"system", "developer", "user", "assistant", "tool"}
CASE_KEYS = {
    "fixture",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "enable_thinking",
    "add_generation_prompt",
    "continue_final_message",
    "reasoning_format",
    "preserve_reasoning",
}
OUTPUT_KEYS = {
    "prompt",
    "generation_prompt",
    "format",
    "supports_thinking",
    "thinking_start_tag",
    "thinking_end_tags",
    "grammar",
    "grammar_lazy",
    "grammar_triggers",
    "preserved_tokens",
    "additional_stops",
}
TRIGGER_TYPES = {"word", "pattern", "pattern_full", "token"}
REASONING_MODES = {"NONE", "TAG_BASED", "TOOLS_ONLY"}
MSG_KEYS = {"role", "content", "reasoning_content", "tool_calls"}


@cache
def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _check_params(out: dict, grammars: list[str]) -> None:
    assert out["format"].startswith("peg-") or out["format"] == "Content-only"
    assert out["grammar"] is None or 0 <= out["grammar"] < len(grammars)
    assert all(t["type"] in TRIGGER_TYPES and t["value"] for t in out["grammar_triggers"])
    assert not out["grammar_lazy"] or out["grammar"] is not None
    for key in ("thinking_end_tags", "preserved_tokens", "additional_stops"):
        assert all(isinstance(s, str) for s in out[key])


def _check_msg(msg: dict) -> None:
    assert MSG_KEYS <= set(msg) and msg["role"] == "assistant"
    for call in msg["tool_calls"]:
        assert set(call) == {"name", "arguments", "id"}


def test_render_cases_cover_every_template_and_case() -> None:
    doc = _load("render_cases.json")
    files = sorted(p.name for p in TEMPLATES.glob("*.jinja"))
    assert len(files) == 70 and sorted(doc["templates"]) == files
    fixtures, tools, cases = doc["fixtures"], doc["tools"], doc["cases"]
    for messages in fixtures.values():
        assert messages and all(m["role"] in ROLES for m in messages)
    assert {c["fixture"] for c in cases} == set(fixtures)
    assert {c["tools"] for c in cases} == {None, *tools}
    assert {c["tool_choice"] for c in cases} == {"auto", "required", "none"}
    assert {c["enable_thinking"] for c in cases} == {True, False}
    assert {c["add_generation_prompt"] for c in cases} == {True, False}
    assert {c["parallel_tool_calls"] for c in cases} == {True, False}
    for case in cases:
        assert set(case) == CASE_KEYS
    keyed = [json.dumps(c, sort_keys=True) for c in cases]
    assert len(set(keyed)) == len(keyed), "a case is recorded twice"
    caps_keys = None
    for name, entry in doc["templates"].items():
        assert entry["error"] is None, name
        caps_keys = caps_keys or set(entry["caps"])
        assert set(entry["caps"]) == caps_keys and isinstance(
            entry["supports_enable_thinking"], bool
        )
        assert len(entry["out"]) == len(cases), name
        analysis = entry["analysis"]
        assert analysis["specialized"] or analysis["reasoning"]["mode"] in REASONING_MODES
        assert entry["patched_source"] is None or entry["patched_source"] != ""
        assert set(entry["out"]) == set(range(len(entry["outputs"]))), f"{name}: orphan output"
        used_prompts = set()
        for out in entry["outputs"]:
            if "error" in out:
                assert set(out) == {"error"} and out["error"]
                continue
            assert set(out) == OUTPUT_KEYS, name
            _check_params(out, doc["grammars"])
            used_prompts.add(out["prompt"])
        assert used_prompts == set(range(len(entry["prompts"]))), f"{name}: orphan prompt"
    assert len(set(doc["grammars"])) == len(doc["grammars"])


def test_render_cases_use_the_recorded_clock() -> None:
    doc = _load("render_cases.json")
    entry = doc["templates"]["meta-llama-Llama-3.1-8B-Instruct.jinja"]
    assert f"Today Date: {doc['meta']['date_string']}\n" in entry["prompts"][0]
    assert entry["prompts"][0].startswith(doc["meta"]["bos_token"])


def _strip_normalized(msg: dict) -> tuple:
    """A message as test-chat.cpp compares it: stripped text, arguments as parsed JSON."""

    def args(a: str) -> object:
        try:
            return json.loads(a)
        except ValueError:
            return None

    calls = [(c["name"], args(c["arguments"]), c["id"]) for c in msg["tool_calls"]]
    return msg["content"].strip(), msg["reasoning_content"].strip(), calls


def test_parse_cases_are_whole() -> None:
    doc = _load("parse_cases.json")
    cases = doc["cases"]
    assert len(cases) >= 400 and len({c["template"] for c in cases}) >= 55
    assert [c["id"] for c in cases] == list(range(len(cases)))
    for case in cases:
        assert (TEMPLATES / case["template"]).is_file(), case["template"]
        assert case["request"]["messages"] and isinstance(case["input"], str)
        _check_params(case["params"], doc["grammars"])
        _check_msg(case["expect"])
        _check_msg(case["parsed"])
        # llama.cpp's own parse satisfies its test's expectation, as the test compares them
        assert _strip_normalized(case["parsed"]) == _strip_normalized(case["expect"]), case["id"]


@pytest.mark.parametrize("key", ["content", "reasoning_content"])
def test_parse_streams_only_grow_and_end_in_the_whole_parse(key: str) -> None:
    cases = [c for c in _load("parse_cases.json")["cases"] if "stream" in c]
    assert len(cases) >= 100
    assert {c["kind"] for c in cases} >= {"call", "parallel_calls", "reasoning", "content"}
    for case in cases:
        lengths = [n for n, _, _ in case["stream"]]
        assert lengths == sorted(set(lengths)) and lengths[-1] <= len(case["input"].encode())
        assert case["stream"][-1][2] == case["parsed"], case["id"]
        prev = None
        for _, partial, msg in case["stream"]:
            _check_msg(msg)
            assert isinstance(partial, bool)
            if prev is not None:
                assert msg[key].startswith(prev[key]), case["id"]
                assert len(msg["tool_calls"]) >= len(prev["tool_calls"]), case["id"]
                for new, old in zip(msg["tool_calls"], prev["tool_calls"], strict=False):
                    assert new["arguments"].startswith(old["arguments"]), case["id"]
            prev = msg


def test_roundtrips_cover_every_template() -> None:
    doc = _load("parse_cases.json")
    files = {p.name for p in TEMPLATES.glob("*.jinja")}
    rows, turns = doc["roundtrip"], doc["roundtrip_turns"]
    assert {r["template"] for r in rows} == files
    assert {r["turn"] for r in rows} == set(turns)
    assert sum("input" in r for r in rows) >= 300
    for row in rows:
        if "error" in row:
            assert "input" not in row and row["error"]
            continue
        assert set(row) == {"template", "turn", "enable_thinking", "input", "parsed", "tail"}
        _check_msg(row["parsed"])
        turn = turns[row["turn"]]
        want = {
            "content": turn.get("content") or "",
            "reasoning_content": turn.get("reasoning_content") or "",
            "tool_calls": [
                {**c["function"], "id": row["parsed"]["tool_calls"][i]["id"]}
                for i, c in enumerate(turn.get("tool_calls") or [])
            ],
        }
        # the recorded parse is the turn the template rendered (as test-chat.cpp compares)
        assert _strip_normalized(row["parsed"]) == _strip_normalized(want), row
