"""The chat parser's cost per token on a long answer (a bench, not a test): a Qwen3-style
answer of ~4k tokens (reasoning, content, then a tool call with a long string argument)
streamed in 4-character pieces (about one token each) through `MessageStream`, which
re-parses the whole text each step as llama.cpp does; prints the mean and the last step's
cost. Run: python scripts/bench_chat_parser.py [--runs N] [--json PATH] (PATH: the runs'
figures as JSON, for bench/results)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loraserve.chat.formats.detect import detect  # noqa: E402
from loraserve.chat.formats.parse import ChatParser  # noqa: E402
from loraserve.chat.formats.stream import MessageStream  # noqa: E402
from tests.unit.chat.format_util import TEMPLATES, render_for  # noqa: E402

PARAMS = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
TOOLS = [{"type": "function", "function": {"name": "write", "parameters": PARAMS}}]


def run() -> dict:
    """One pass over the answer: its size and the per-piece costs."""
    src = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    fmt = detect(src, render_for(src))
    words = " ".join(f"word{i}" for i in range(830))
    call = json.dumps({"name": "write", "arguments": {"text": words}})
    text = f"<think>\n{words}\n</think>\n\n{words[:4000]}\n<tool_call>\n{call}\n</tool_call>"
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    stream = MessageStream(ChatParser(fmt, TOOLS))
    t0 = time.perf_counter()
    last = 0.0
    for p in pieces:
        t = time.perf_counter()
        stream.feed(p)
        last = time.perf_counter() - t
    stream.finish()
    total = time.perf_counter() - t0
    n = len(pieces)
    print(f"{n} pieces ({len(text)} chars): {total * 1e3 / n:.3f} ms per piece on average, "
          f"{last * 1e3:.3f} ms for the last, {total:.2f} s in all", flush=True)  # fmt: skip
    return {"pieces": n, "chars": len(text), "mean_ms": total * 1e3 / n, "last_ms": last * 1e3,
            "total_s": total}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    runs = [run() for _ in range(args.runs)]
    if args.json:
        load = os.getloadavg()
        args.json.write_text(json.dumps({"bench": "chat_parser", "load_avg": load,
                                         "runs": runs}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
