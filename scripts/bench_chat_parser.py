"""The chat parser's cost per token on a long answer (a bench, not a test): a Qwen3-style
answer of ~4k tokens (reasoning, content, then a tool call with a long string argument)
streamed in 4-character pieces (about one token each) through `MessageStream`, which
re-parses the whole text each step as llama.cpp does; prints the mean and the last step's
cost. Run: python scripts/bench_chat_parser.py"""

from __future__ import annotations

import json
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


def main() -> None:
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
          f"{last * 1e3:.3f} ms for the last, {total:.2f} s in all")  # fmt: skip


if __name__ == "__main__":
    main()
