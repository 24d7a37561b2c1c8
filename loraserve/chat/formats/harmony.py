"""gpt-oss's harmony answers (llama.cpp common/parsers/gpt-oss.cpp): a sequence of
messages `<|start|>assistant[ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>
TYPE]<|message|>BODY<|end|>`. The `analysis` channel is reasoning, `commentary` without a
recipient and `final` are content, a message to `functions.NAME` is a call of NAME with
BODY as its JSON arguments; messages to other recipients (built-in tools such as
`container.exec`) are dropped. A stray `<|channel|>commentary to=assistant` before a
channel is skipped, as llama.cpp does."""

from __future__ import annotations

import re

from loraserve.chat.formats.scan import held

START, CHANNEL, MESSAGE, END = "<|start|>assistant", "<|channel|>", "<|message|>", "<|end|>"
_TO = re.compile(r"\s*to=(\S+?)(?=<\||\s|$)")


def parse_harmony(text: str, partial: bool, tools: bool, extract: bool):  # noqa: ANN201
    """(content, reasoning, calls as (name, arguments)) of `text` (the answer after the
    turn's `<|start|>assistant`); with `partial`, only what later text cannot change."""
    content, reasoning, calls = "", "", []
    for seg in text.split(START):
        if MESSAGE not in seg:  # a header still being written (or none)
            break
        header, body = seg.split(MESSAGE, 1)
        closed = END in body
        if closed:
            body = body[: body.index(END)]
        elif partial:
            body = body[: len(body) - held(body, (END,))]
        channel = header.rsplit(CHANNEL, 1)[-1] if CHANNEL in header else ""
        name = channel.split()[0] if channel.split() else ""
        recipients = [r for r in _TO.findall(header) if r != "assistant"]
        if recipients:
            to = recipients[-1]
            if tools and to.startswith("functions."):
                calls.append((to.removeprefix("functions."), body))
            continue
        if name == "analysis":
            if extract:
                reasoning += body
            else:
                content += CHANNEL + "analysis" + MESSAGE + body + (END if closed else "")
        elif name in ("final", "commentary"):
            content += body
    return content, reasoning, calls
