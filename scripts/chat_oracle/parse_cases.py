"""Record llama.cpp's parse cases (tests/test-chat.cpp's PEG parser tests) as parse_cases.json.

Runs the patched copy of the peer's test-chat (built by build.sh), which appends one JSON line
per passed parser test case, then keeps the every-prefix streaming parses of a few
representative cases per template (see `pick_streams`), adds the round trips of every
template (roundtrip.py) and writes the JSON file.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

STREAMS_PER_TEMPLATE = 3


def kind(case: dict) -> str:
    """What a case's parsed message holds, for choosing representative streams."""
    msg = case["parsed"]
    calls = len(msg["tool_calls"])
    if calls > 1:
        return "parallel_calls"
    if calls and msg["reasoning_content"]:
        return "reasoning_and_call"
    if calls:
        return "call"
    if msg["reasoning_content"]:
        return "reasoning"
    return "content"


def pick_streams(cases: list[dict]) -> set[int]:
    """Indices of the cases whose streams are kept: per template, one of each kind in order."""
    order = ["parallel_calls", "reasoning_and_call", "call", "reasoning", "content"]
    keep: set[int] = set()
    by_template: dict[str, list[int]] = {}
    for i, case in enumerate(cases):
        by_template.setdefault(case["template"], []).append(i)
    for ids in by_template.values():
        chosen: list[int] = []
        for k in order:
            hit = next((i for i in ids if kind(cases[i]) == k and not cases[i]["is_partial"]), None)
            if hit is not None and len(chosen) < STREAMS_PER_TEMPLATE:
                chosen.append(hit)
        keep.update(chosen)
    return keep


def record(peer: Path, bin_dir: Path, data: Path, meta: dict) -> None:
    """Run test-chat-oracle in the peer tree, add the round trips, write parse_cases.json."""
    import roundtrip
    from record import TOKENS, Oracle, write_json

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "parse.jsonl"
        env = {**os.environ, "TZ": "UTC", "CHAT_ORACLE_PARSE_OUT": str(raw)}
        subprocess.run(
            [str(bin_dir / "test-chat-oracle")],
            cwd=peer,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        rows = [json.loads(line) for line in raw.read_text().splitlines()]
    grammars: list[str] = []
    grammar_ids: dict[str, int] = {}
    streams = pick_streams(rows)
    cases = []
    for i, row in enumerate(rows):
        params = row["params"]
        g = params["grammar"]
        params["grammar"] = None if g == "" else grammar_ids.setdefault(g, len(grammar_ids))
        if g and params["grammar"] == len(grammars):
            grammars.append(g)
        case = {
            "id": i,
            "template": row["template"].removeprefix("models/templates/"),
            "kind": kind(row),
            "request": row["request"],
            "input": row["input"],
            "is_partial": row["is_partial"],
            "expect": row["expect"],
            "parsed": row["parsed"],
            "params": params,
        }
        if i in streams:
            case["stream"] = row["stream"]
        cases.append(case)
    doc = {"meta": {**meta, "source_test": "tests/test-chat.cpp"}, "grammars": grammars}
    doc["cases"] = cases
    names = sorted(p.name for p in (peer / "models" / "templates").glob("*.jinja"))
    oracle = Oracle(peer)
    doc["roundtrip_request"] = roundtrip.request_template()
    doc["roundtrip_turns"] = roundtrip.TURNS
    doc["roundtrip"] = roundtrip.record_roundtrip(oracle, TOKENS, names)
    oracle.close()
    out = data / "parse_cases.json"
    write_json(out, doc)
    print(f"wrote {out}: {len(cases)} cases over {len({c['template'] for c in cases})} templates,")
    print(f"  {len(streams)} with streams, {len(grammars)} grammars, {out.stat().st_size} bytes")
    ok = sum(1 for r in doc["roundtrip"] if "input" in r)
    print(f"  round trips: {ok} of {len(doc['roundtrip'])} parse back")
