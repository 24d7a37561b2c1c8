"""Round-trip parse cases for every template: an assistant turn as the template renders it,
parsed back by llama.cpp.

For each template and each assistant message of TURNS, the model's text is what rendering
[user, assistant] adds after the prompt of [user] with the generation prompt; its end-of-turn
markup is cut at the longest prefix that llama.cpp parses (not partial) back into the same
message (stripped text, arguments as JSON). The 12 templates test-chat.cpp has no parser
case for get one this way too.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import fixtures

USER = fixtures.USER
TURNS: dict[str, dict] = {
    "content": {"role": "assistant", "content": "It is 21 degrees in Paris."},
    "reasoning_content": {
        "role": "assistant",
        "reasoning_content": "A plain question; no tool needed.",
        "content": "It is 21 degrees in Paris.",
    },
    "call": {"role": "assistant", "content": None, "tool_calls": [fixtures.CALL_WEATHER]},
    "parallel_calls": {
        "role": "assistant",
        "content": None,
        "tool_calls": [fixtures.CALL_WEATHER, fixtures.CALL_EVENT],
    },
    "reasoning_call": {
        "role": "assistant",
        "content": None,
        "reasoning_content": "The user wants the weather; call get_weather.",
        "tool_calls": [fixtures.CALL_WEATHER],
    },
}


def _request(messages: list[dict], thinking: bool, agp: bool) -> dict:
    return {
        "messages": messages,
        "tools": fixtures.TOOLS["two"],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "enable_thinking": thinking,
        "add_generation_prompt": agp,
        "reasoning_format": "deepseek",
        "chat_template_kwargs": {"preserve_reasoning": True},  # llama-server's default
    }


def request_template() -> dict:
    """The request every round trip parses with (enable_thinking as each entry says)."""
    req = _request([USER], True, True)
    del req["enable_thinking"]
    return req


def _norm(msg: dict) -> tuple:
    """A message compared as test-chat.cpp compares (ids ignored: templates may drop them)."""

    def args(a: object) -> object:
        try:
            return json.loads(a) if isinstance(a, str) else a
        except ValueError:
            return None

    calls = msg.get("tool_calls") or []
    if calls and "function" in calls[0]:
        calls = [c["function"] for c in calls]
    return (
        (msg.get("content") or "").strip(),
        (msg.get("reasoning_content") or "").strip(),
        [(c["name"], args(c["arguments"])) for c in calls],
    )


def record_roundtrip(oracle, tokens: dict, names: list[str]) -> list[dict]:
    """One entry per template x turn x enable_thinking: the text and llama.cpp's parse of it."""
    out = []
    for name in names:
        path = f"models/templates/{name}"
        for turn, msg in TURNS.items():
            for thinking in (True, False):
                if not thinking and "reasoning" in turn:
                    continue
                entry = {"template": name, "turn": turn, "enable_thinking": thinking}
                entry.update(_one(oracle, tokens, path, msg, thinking))
                out.append(entry)
    return out


def _one(oracle, tokens: dict, path: str, msg: dict, thinking: bool) -> dict:
    ask = lambda q: oracle.ask({**q, **tokens, "template": path})  # noqa: E731
    head = ask({"op": "render", "request": _request([USER], thinking, True)})
    full = ask({"op": "render", "request": _request([USER, copy.deepcopy(msg)], thinking, False)})
    if "error" in head or "error" in full:
        return {"error": head.get("error") or full.get("error")}
    prompt = head["prompt"]
    if not full["prompt"].startswith(prompt):
        return {"error": "the rendered turn does not extend the generation prompt"}
    rest = full["prompt"][len(prompt) :]
    want = _norm(msg)
    request = _request([USER], thinking, True)
    # the longest prefix that parses back, cut where end-of-turn markup would start
    cuts = [n for n in range(len(rest), 0, -1) if n == len(rest) or rest[n] in "<[\n"]
    texts = [rest[:n] for n in cuts]
    answers = ask({"op": "parse", "request": request, "texts": texts, "is_partial": False})
    for n, text, ans in zip(cuts, texts, answers["messages"], strict=True):
        if "error" not in ans and _norm(ans) == want:
            return {"input": text, "parsed": ans, "tail": rest[n:]}
    return {
        "error": "no prefix of the rendered turn parses back to the message",
        "rendered": rest,
        "parsed_whole": answers["messages"][0],
    }


def main() -> None:
    """Print a summary (debugging aid): python roundtrip.py."""
    from record import PEER, TOKENS, Oracle

    names = sorted(p.name for p in (PEER / "models" / "templates").glob("*.jinja"))
    oracle = Oracle(PEER)
    rows = record_roundtrip(oracle, TOKENS, names)
    oracle.close()
    ok = [r for r in rows if "input" in r]
    print(f"{len(ok)} / {len(rows)} round-trip")
    for r in rows:
        if "error" in r:
            print(r["template"], r["turn"], r["enable_thinking"], r["error"][:80])
    Path("/tmp/roundtrip.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
