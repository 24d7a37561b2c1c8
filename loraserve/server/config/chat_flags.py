"""Command-line flags of chat parsing, as llama-server spells them: `--reasoning-format`
(none: reasoning stays in `content`; auto / deepseek: it goes to `reasoning_content`;
deepseek-legacy: also, except in streams, where it stays inline), `--reasoning-budget`
(-1 unlimited; 0 turns thinking off; other budgets are accepted and not enforced yet) and
`--skip-chat-parsing` (answers are plain text: no reasoning split, no tool calls)."""

from __future__ import annotations

import argparse

from loraserve.server.config.arg_types import int_in

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


def add_flags(p: argparse.ArgumentParser) -> None:
    """Register the chat-parsing flags."""
    g = p.add_argument_group("chat parsing")
    g.add_argument(
        "--reasoning-format",
        choices=REASONING_FORMATS,
        help="where a model's reasoning goes (default: %(default)s)",
    )
    g.add_argument(
        "--reasoning-budget",
        type=int_in(-1),
        help="-1 = unlimited, 0 = thinking off (default: %(default)s)",
    )
    g.add_argument(
        "--skip-chat-parsing",
        action="store_true",
        help="answer plain text: no reasoning_content, no tool calls",
    )
