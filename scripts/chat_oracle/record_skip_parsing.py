"""Record llama-server's answers under `--skip-chat-parsing` with an assistant prefill (never
run in CI; writes tests/data/chat/skip_parsing_server.json).

    python scripts/chat_oracle/record_skip_parsing.py

Starts the peer's llama-server on the Gemma 3 270M GGUF with Qwen3's template, once with
`--skip-chat-parsing` and once without, and records for each request its /apply-template
prompt and a greedy 8-token /v1/chat/completions answer (message, usage). Qwen3's template
reads neither the BOS token nor the date, so the prompts hold for any vocabulary.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from record import DATA, PEER  # type: ignore[import-not-found]

MODEL = Path.home() / ".cache/loraserve/gemma3-270m-q4_k_m.gguf"
TEMPLATE = "Qwen-Qwen3-0.6B.jinja"
PORT = 18098
USER = [{"role": "user", "content": "Weather in Paris?"}]
REQUESTS = {
    "plain": {"messages": USER},
    "prefill_content": {"messages": [*USER, {"role": "assistant", "content": "It is"}]},
    "prefill_reasoning": {
        "messages": [*USER, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]
    },
    "continue_explicit": {
        "messages": [*USER, {"role": "assistant", "content": "It is"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    },
    "no_thinking_prefill": {
        "messages": [*USER, {"role": "assistant", "content": "It is"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
}


def _post(path: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": json.loads(e.read().decode())}


def _serve(flags: list[str]) -> dict:
    cmd = [str(PEER / "build/bin/llama-server"), "-m", str(MODEL), "--jinja", "--port", str(PORT),
           "--chat-template-file", str(PEER / "models/templates" / TEMPLATE), "-c", "1024",
           "-t", "1", "-np", "1", *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        out = {}
        for name, body in REQUESTS.items():
            prompt = _post("/apply-template", body)
            answer = _post("/v1/chat/completions", {**body, "n_predict": 8, "temperature": 0})
            if "choices" in answer:
                answer = {"message": answer["choices"][0]["message"],
                          "finish_reason": answer["choices"][0]["finish_reason"],
                          "prompt_tokens": answer["usage"]["prompt_tokens"]}  # fmt: skip
            out[name] = {"prompt": prompt.get("prompt", prompt), "answer": answer}
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    doc = {
        "meta": {
            "source": "llama-server of the llama-cpp-python 0.3.36 sdist, Gemma 3 270M Q4_K_M",
            "recorded_by": "scripts/chat_oracle/record_skip_parsing.py",
            "template": TEMPLATE,
        },
        "requests": REQUESTS,
        "skip_chat_parsing": _serve(["--skip-chat-parsing"]),
        "parsing": _serve([]),
    }
    path = DATA / "skip_parsing_server.json"
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
