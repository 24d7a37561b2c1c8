"""Record llama.cpp's parses of answers to assistant prefills (never run in CI; writes
tests/data/chat/prefill_parse.json).

    python scripts/chat_oracle/record_prefill_parse.py   # after scripts/chat_oracle/build.sh

For each of the 70 templates and each request of record_prefill_server.REQUESTS (a last
assistant message with reasoning only, with tools, with reasoning and content, with
thinking off by the kwarg), as llama-server sends it (continue_final_message true,
enable_thinking from the template's support unless the kwarg sets it, preserve_reasoning
true), chat_oracle renders the prompt (common_chat_templates_apply) and parses model
outputs with the parser and generation prompt that render gives (common_chat_peg_parse of
generation_prompt + output, what llama-server's answer is): " sunny", and, where the render
has reasoning end tags, " sunny" + the first end tag + " Done.". The clock is
record.py's fixed one.

Schema: {meta, requests, outputs: [text templates, "{end}" the end tag],
templates: {name: {request key: {prompt, generation_prompt, thinking_end_tags,
parsed: [MSG | {error} per output, null where the output needs an end tag and there is
none]} | {error}}}}; MSG as parse_cases.json's.
"""

from __future__ import annotations

from pathlib import Path

from record import DATA, META, PEER, TOKENS, Oracle, write_json  # type: ignore[import-not-found]
from record_prefill_server import REQUESTS  # type: ignore[import-not-found]

OUTPUTS = [" sunny", " sunny{end} Done."]


def _request(body: dict, thinking: bool) -> dict:
    kwargs = {"preserve_reasoning": True, **body.get("chat_template_kwargs", {})}
    req = {
        "messages": body["messages"],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "enable_thinking": kwargs.get("enable_thinking", thinking),
        "add_generation_prompt": True,
        "continue_final_message": True,
        "reasoning_format": "deepseek",
        "chat_template_kwargs": kwargs,
    }
    if "tools" in body:
        req["tools"] = body["tools"]
    return req


def record(oracle: Oracle, name: str) -> dict:
    path = f"models/templates/{name}"
    info = oracle.ask({"op": "info", "template": path, **TOKENS})
    if info.get("error"):
        return {"error": info["error"]}
    out: dict = {}
    for key, body in REQUESTS.items():
        req = _request(body, bool(info.get("supports_enable_thinking")))
        ans = oracle.ask({"op": "render", "template": path, "request": req, **TOKENS})
        if "error" in ans:
            out[key] = {"error": ans["error"]}
            continue
        ends = ans.get("thinking_end_tags") or []
        texts = [o if "{end}" not in o else o.replace("{end}", ends[0]) if ends else None
                 for o in OUTPUTS]  # fmt: skip
        parsed = []
        for text in texts:
            if text is None:
                parsed.append(None)
                continue
            q = {"op": "parse", "template": path, "request": req, "text": text, **TOKENS}
            got = oracle.ask(q)
            parsed.append(got.get("message", got))
        out[key] = {"prompt": ans["prompt"], "generation_prompt": ans["generation_prompt"],
                    "thinking_end_tags": ends, "parsed": parsed}  # fmt: skip
    return out


def main() -> None:
    names = sorted(p.name for p in (PEER / "models" / "templates").glob("*.jinja"))
    oracle = Oracle(PEER)
    templates = {}
    for name in names:
        templates[name] = record(oracle, name)
        print(name, flush=True)
    oracle.close()
    meta = {**META, "recorded_by": "scripts/chat_oracle/record_prefill_parse.py"}
    doc = {"meta": meta, "requests": REQUESTS, "outputs": OUTPUTS, "templates": templates}
    path: Path = DATA / "prefill_parse.json"
    write_json(path, doc)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
