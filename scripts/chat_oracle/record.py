"""Record llama.cpp's own chat-template answers as test data (never run in CI).

    scripts/chat_oracle/build.sh                 # once: builds ~/.cache/loraserve/chat_oracle/
    python scripts/chat_oracle/record.py render  # tests/data/chat/render_cases.json + templates/
    python scripts/chat_oracle/record.py parse   # tests/data/chat/parse_cases.json

`render` asks chat_oracle (common_chat_templates_apply of the peer's libllama-common) for
every template in the peer's models/templates x every case of fixtures.cases(); `parse` runs
the patched copy of the peer's tests/test-chat.cpp, which writes each PEG parser test case it
passes (and its every-prefix streaming parses), and asks chat_oracle for extra streams.
The JSON schema is described in scripts/chat_oracle/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import fixtures  # noqa: E402

PEER = Path.home() / ".cache/loraserve/peer/llama_cpp_python-0.3.36/vendor/llama.cpp"
BIN = Path(os.environ.get("CHAT_ORACLE_DIR", Path.home() / ".cache/loraserve/chat_oracle"))
DATA = ROOT / "tests" / "data" / "chat"
META = {
    "source": "llama.cpp vendored in the llama-cpp-python 0.3.36 sdist (common/chat.cpp)",
    "recorded_by": "scripts/chat_oracle/record.py",
    "now_utc": "2025-03-14T09:26:53Z",
    "tz": "UTC",
    "date_string": "14 Mar 2025",
    "datetime": "Mar 14 2025",
    "strftime_now": "strftime of 2025-03-14 09:26:53 UTC",
    "bos_token": "<s>",
    "eos_token": "</s>",
}
TOKENS = {"bos_token": META["bos_token"], "eos_token": META["eos_token"]}


class Oracle:
    """One chat_oracle process: JSON request in, JSON answer out, one line each."""

    def __init__(self, peer: Path) -> None:
        self.proc = subprocess.Popen(
            [str(BIN / "chat_oracle")],
            cwd=peer,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "TZ": "UTC"},
        )

    def ask(self, query: dict) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(query) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait()


def write_json(path: Path, doc: dict) -> None:
    """Compact JSON, one line per top-level key and per entry of its dict or list values."""
    dump = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
    lines = []
    for key, value in doc.items():
        if isinstance(value, dict) and value and key != "meta":
            body = ",\n".join(f"  {dump(k)}:{dump(v)}" for k, v in value.items())
            lines.append(f"{dump(key)}:{{\n{body}\n}}")
        elif isinstance(value, list) and value:
            body = ",\n".join(f"  {dump(v)}" for v in value)
            lines.append(f"{dump(key)}:[\n{body}\n]")
        else:
            lines.append(f"{dump(key)}:{dump(value)}")
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")


def record_render(peer: Path) -> None:
    """Render every template x case; write render_cases.json and copy the templates."""
    tdir = peer / "models" / "templates"
    names = sorted(p.name for p in tdir.glob("*.jinja"))
    (DATA / "templates").mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(tdir / name, DATA / "templates" / name)
    cases = fixtures.cases()
    oracle = Oracle(peer)
    grammars: list[str] = []
    grammar_ids: dict[str, int] = {}
    templates: dict[str, dict] = {}
    for name in names:
        path = f"models/templates/{name}"
        info = oracle.ask({"op": "info", "template": path, **TOKENS})
        entry: dict = {
            "error": info.get("error"),
            "caps": info.get("caps"),
            "supports_enable_thinking": info.get("supports_enable_thinking"),
            "analysis": info.get("analysis"),
            "patched_source": None,
            "prompts": [],
            "outputs": [],
            "out": [],
        }
        file_src = (tdir / name).read_text()  # jinja drops one trailing newline, as does llama.cpp
        if info.get("source") not in (None, file_src.removesuffix("\n")):
            entry["patched_source"] = info["source"]
        seen: dict[str, int] = {}
        prompt_ids: dict[str, int] = {}
        for case in cases:
            query = {"op": "render", "template": path, "request": fixtures.request(case)}
            ans = oracle.ask({**query, **TOKENS})
            if "grammar" in ans:
                g = ans["grammar"]
                if g == "":
                    ans["grammar"] = None
                else:
                    ans["grammar"] = grammar_ids.setdefault(g, len(grammars))
                    if ans["grammar"] == len(grammars):
                        grammars.append(g)
                prompt = ans["prompt"]
                ans["prompt"] = prompt_ids.setdefault(prompt, len(entry["prompts"]))
                if ans["prompt"] == len(entry["prompts"]):
                    entry["prompts"].append(prompt)
            key = json.dumps(ans, sort_keys=True)
            if key not in seen:
                seen[key] = len(entry["outputs"])
                entry["outputs"].append(ans)
            entry["out"].append(seen[key])
        templates[name] = entry
        errs = sum(1 for o in entry["outputs"] if "error" in o)
        print(f"{name}: {len(entry['outputs'])} distinct outputs, {errs} errors", flush=True)
    oracle.close()
    doc = {
        "meta": META,
        "fixtures": fixtures.FIXTURES,
        "tools": fixtures.TOOLS,
        "cases": cases,
        "grammars": grammars,
        "templates": templates,
    }
    out = DATA / "render_cases.json"
    write_json(out, doc)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["render", "parse"])
    ap.add_argument("--peer", type=Path, default=PEER)
    args = ap.parse_args()
    if args.what == "render":
        record_render(args.peer)
    else:
        import parse_cases

        parse_cases.record(args.peer, BIN, DATA, META)


if __name__ == "__main__":
    main()
