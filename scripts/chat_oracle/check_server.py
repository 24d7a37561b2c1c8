"""Check the recorded renders against a live llama-server (never run in CI).

    python scripts/chat_oracle/check_server.py [TEMPLATE.jinja ...]   # default: all 70

Starts the peer's llama-server on the Gemma 3 270M GGUF with each template
(--chat-template-file) and compares, for every case of render_cases.json, its /apply-template
prompt with chat_oracle's render given the model's own BOS/EOS, and /props
chat_template_caps with the recorded caps. Two differences are expected and undone before
comparing: the server strips the template's leading BOS text (the vocab adds BOS), and it
renders today's date where the recording fixed 2025-03-14.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fixtures  # noqa: E402
from record import DATA, PEER, Oracle  # noqa: E402

MODEL = Path.home() / ".cache/loraserve/gemma3-270m-q4_k_m.gguf"
URL = "http://127.0.0.1:18099"
DATE_FORMATS = ["%d %b %Y", "%b %d %Y", "%Y-%m-%d", "%B %d, %Y", "%d %B %Y", "%B %d %Y"]


def _post(path: str, body: dict) -> dict:
    req = urllib.request.Request(
        URL + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"error": e.read().decode()}


def _server_date(prompt: str, bos: str) -> str:
    """The recorded render as llama-server writes it today with this vocab."""
    prompt = prompt.removeprefix(bos)
    fixed = datetime.datetime(2025, 3, 14, 9, 26, 53)
    today = datetime.datetime.now(datetime.UTC)
    for fmt in DATE_FORMATS:
        prompt = prompt.replace(fixed.strftime(fmt), today.strftime(fmt))
    return prompt


def check(name: str, doc: dict, oracle: Oracle) -> int:
    """Number of cases where llama-server and the recording disagree for this template."""
    cmd = [str(PEER / "build/bin/llama-server"), "-m", str(MODEL), "--jinja", "--port", "18099"]
    cmd += ["--chat-template-file", str(PEER / "models/templates" / name), "-c", "512", "-t", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                props = json.loads(urllib.request.urlopen(URL + "/props", timeout=2).read())
                break
            except OSError:
                time.sleep(0.5)
        bad = int(props["chat_template_caps"] != doc["templates"][name]["caps"])
        tokens = {"bos_token": props["bos_token"], "eos_token": props["eos_token"]}
        for case in doc["cases"]:
            req = fixtures.request(case)
            body = {k: v for k, v in req.items() if k != "enable_thinking"}
            kwargs = {**req["chat_template_kwargs"], "enable_thinking": case["enable_thinking"]}
            body["chat_template_kwargs"] = kwargs
            srv = _post("/apply-template", body)
            query = {"op": "render", "template": f"models/templates/{name}", "request": req}
            ora = oracle.ask({**query, **tokens})
            if "error" in srv and "error" in ora:
                continue
            if srv.get("prompt") != _server_date(ora.get("prompt", ""), tokens["bos_token"]):
                bad += 1
                print(f"  differs: {case}")
        return bad
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    doc = json.loads((DATA / "render_cases.json").read_text())
    names = sys.argv[1:] or sorted(doc["templates"])
    oracle = Oracle(PEER)
    total = 0
    for name in names:
        bad = check(name, doc, oracle)
        total += bad
        print(f"{name}: {bad} differences", flush=True)
    oracle.close()
    print(f"{len(names)} templates x {len(doc['cases'])} cases: {total} differences")


if __name__ == "__main__":
    main()
