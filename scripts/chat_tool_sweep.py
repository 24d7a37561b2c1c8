"""Tool calls over HTTP on the tiny model with every template of the peer's directory (a
check, not a test: ~5 min). For each of the 70 templates: `tool_choice` required, a named
function and auto, one call at most, 512 tokens; then, where the template has reasoning
markers, required and auto after a reasoning prefill. Prints one line per template (finish
reason, calls, whether every complete call validates against its tool's schema) and writes
them as JSON.

    python scripts/chat_tool_sweep.py [--json PATH] [TEMPLATE.jinja ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jsonschema  # noqa: E402

from tests.http.tool_call_util import SCHEMAS, TOOLS, USER  # noqa: E402
from tests.server_util import serve_in_thread  # noqa: E402
from tests.unit.chat.format_util import TEMPLATES  # noqa: E402
from tests.unit.chat.oracle_util import template_format as _format  # noqa: E402

PREFILL = [*USER, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]
NAMED = {"type": "function", "function": {"name": "add"}}


def _ask(s: Any, messages: list, choice: Any) -> dict:
    body = {"messages": messages, "tools": TOOLS, "tool_choice": choice, "n_predict": 512,
            "temperature": 0, "parallel_tool_calls": False}  # fmt: skip
    r = s.client.post("/v1/chat/completions", json=body)
    if r.status_code != 200:
        return {"status": r.status_code, "error": r.text[:200]}
    c = r.json()["choices"][0]
    calls = c["message"].get("tool_calls") or []
    complete = calls[:-1] if c["finish_reason"] == "length" else calls
    valid = True
    for k in complete:
        try:
            jsonschema.validate(json.loads(k["function"]["arguments"]),
                                SCHEMAS[k["function"]["name"]])  # fmt: skip
        except (jsonschema.ValidationError, json.JSONDecodeError, KeyError):
            valid = False
    if choice == NAMED and any(k["function"]["name"] != "add" for k in calls):
        valid = False
    reasoning = c["message"].get("reasoning_content") or ""
    return {"status": 200, "finish": c["finish_reason"], "calls": len(complete),
            "valid": valid, "reasoning": reasoning[:12]}  # fmt: skip


def sweep(name: str) -> dict:
    args = ["-np", "1", "-c", "16384", "--chat-template-file", str(TEMPLATES / name),
            "--reasoning-budget", "8"]  # fmt: skip
    out: dict = {}
    with serve_in_thread(args) as s:
        for tag, choice in (("required", "required"), ("named", NAMED), ("auto", "auto")):
            out[tag] = _ask(s, USER, choice)
        if _format(name).has_reasoning:
            out["prefill_required"] = _ask(s, PREFILL, "required")
            out["prefill_auto"] = _ask(s, PREFILL, "auto")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    names = args.names or [p.name for p in sorted(TEMPLATES.glob("*.jinja"))]
    results = {}
    for name in names:
        results[name] = sweep(name)
        print(name, json.dumps(results[name], ensure_ascii=False), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
