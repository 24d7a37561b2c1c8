"""Record llama-server's prompts for assistant prefills that hold reasoning (never run in CI;
writes tests/data/chat/prefill_server.json). render_cases.json's only prefill is content.

    python scripts/chat_oracle/record_prefill_server.py [TEMPLATE.jinja ...]  # default: all 70

Starts the peer's llama-server on the Gemma 3 270M GGUF with each template
(--chat-template-file, --reasoning auto) and records /props' BOS/EOS and the /apply-template
prompt of each request in REQUESTS (a last assistant message is continued, as
llama-server does by default), or its error. The server renders today's date: `now_utc`.
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

from record import DATA, PEER  # type: ignore[import-not-found]

MODEL = Path.home() / ".cache/loraserve/gemma3-270m-q4_k_m.gguf"
PORT = 18097
URL = f"http://127.0.0.1:{PORT}"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}}]  # fmt: skip
REASONING = {"role": "assistant", "content": "", "reasoning_content": "Let me"}
BOTH = {"role": "assistant", "content": "It is", "reasoning_content": "Let me"}
REQUESTS = {
    "reasoning": {"messages": [*USER, REASONING]},
    "reasoning_tools": {"messages": [*USER, REASONING], "tools": TOOLS},
    "both": {"messages": [*USER, BOTH]},
    "reasoning_off": {
        "messages": [*USER, REASONING],
        "chat_template_kwargs": {"enable_thinking": False},
    },
}


def _get(path: str) -> dict:
    with urllib.request.urlopen(URL + path, timeout=5) as r:
        return json.loads(r.read())


def _post(path: str, body: dict) -> dict:
    req = urllib.request.Request(URL + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"error": json.loads(e.read().decode())["error"]["message"]}


def record(name: str) -> dict:
    cmd = [str(PEER / "build/bin/llama-server"), "-m", str(MODEL), "--jinja", "--port",
           str(PORT), "--chat-template-file", str(PEER / "models/templates" / name),
           "-c", "512", "-t", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                props = _get("/props")
                break
            except OSError:
                time.sleep(0.25)
        out: dict = {"bos_token": props["bos_token"], "eos_token": props["eos_token"]}
        for key, body in REQUESTS.items():
            res = _post("/apply-template", body)
            out[key] = res.get("prompt", {"error": res.get("error")})
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    path = DATA / "prefill_server.json"
    names = sys.argv[1:] or sorted(p.name for p in (DATA / "templates").glob("*.jinja"))
    doc = {
        "meta": {
            "source": "llama-server of the llama-cpp-python 0.3.36 sdist, Gemma 3 270M Q4_K_M",
            "recorded_by": "scripts/chat_oracle/record_prefill_server.py",
            "now_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "requests": REQUESTS,
        "templates": {},
    }
    for name in names:
        doc["templates"][name] = record(name)
        print(name, flush=True)
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
