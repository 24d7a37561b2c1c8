"""Command-line flags of chat parsing, as llama-server spells them: `--reasoning-format`
(none: reasoning stays in `content`; auto / deepseek: it goes to `reasoning_content`;
deepseek-legacy: also, except in streams, where it stays inline), `--reasoning-budget`
(-1 unlimited; 0 turns thinking off; N forces the end marker after N reasoning tokens),
`--reasoning-budget-message` (written before that forced end marker) and
`--[no-]skip-chat-parsing` (answers are plain text: no reasoning split, no tool calls); and of
chat rendering: `-rea/--reasoning on|off|auto` (`enable_thinking` for the template; auto:
on where the template supports thinking; llama.cpp's spellings: on/enabled/true/1,
off/disabled/false/0, auto/-1), `--reasoning-effort LEVEL` (a template kwarg; "default"
leaves it out), `--[no-]reasoning-preserve` (the `preserve_reasoning` kwarg, on by default)
and `--prefill-assistant` / `--no-prefill-assistant` (whether a last
assistant message is continued)."""

from __future__ import annotations

import argparse
from typing import Any

from loraserve.server.config.arg_types import int_in

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
_REASONING = {
    **dict.fromkeys(("on", "enabled", "true", "1"), "on"),
    **dict.fromkeys(("off", "disabled", "false", "0"), "off"),
    **dict.fromkeys(("auto", "-1"), "auto"),
}


def reasoning_value(text: str) -> str:
    """`--reasoning`'s value as on, off or auto (llama.cpp's `is_truthy` / `is_falsey`)."""
    if text not in _REASONING:
        raise argparse.ArgumentTypeError(f"unknown value for --reasoning: {text!r}")
    return _REASONING[text]


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
        "--reasoning-budget-message",
        metavar="MESSAGE",
        help="written before the forced end of thinking when the reasoning budget is spent "
        "(default: none)",
    )
    r = p.add_argument_group("chat rendering")
    r.add_argument(
        "-rea",
        "--reasoning",
        type=reasoning_value,
        metavar="on|off|auto",
        help="enable_thinking for the template; auto: where the template supports thinking "
        "(default: %(default)s)",
    )
    r.add_argument(
        "--reasoning-effort",
        metavar="LEVEL",
        help="reasoning_effort given to the template (minimal, low, medium, high...); "
        "'default' keeps the template's (default: default)",
    )
    r.add_argument(
        "--reasoning-preserve",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="past reasoning kept in the prompt, for templates that can (the template kwarg "
        "preserve_reasoning; default: on)",
    )
    r.add_argument(
        "--prefill-assistant",
        action=argparse.BooleanOptionalAction,
        help="continue a last assistant message instead of starting a new one "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--skip-chat-parsing",
        action=argparse.BooleanOptionalAction,
        help="answer plain text: no reasoning_content, no tool calls (default: %(default)s)",
    )


def template_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """llama-server's default template kwargs: `--chat-template-kwargs`, with
    `--reasoning-effort`'s level and `preserve_reasoning` (`--[no-]reasoning-preserve`, else
    the kwargs', else true)."""
    kwargs = dict(ns.chat_template_kwargs or {})
    if ns.reasoning_preserve is not None:
        kwargs["preserve_reasoning"] = ns.reasoning_preserve
    kwargs.setdefault("preserve_reasoning", True)
    effort = getattr(ns, "reasoning_effort", None)
    if effort == "default":
        kwargs.pop("reasoning_effort", None)
    elif effort is not None:
        kwargs["reasoning_effort"] = effort
    return kwargs
