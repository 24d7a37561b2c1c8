"""The chat rendering flags, as llama.cpp's common/arg.cpp reads them: `-rea/--reasoning`
(on/enabled/true/1, off/disabled/false/0, auto/-1), `--reasoning-effort` ("default" leaves
the kwarg out), `--[no-]reasoning-preserve` (the `preserve_reasoning` kwarg, true unless
given), `--[no-]prefill-assistant`; and of chat parsing: `--reasoning-budget-message`,
`--[no-]skip-chat-parsing`."""

from __future__ import annotations

import pytest

from loraserve.server.config.args import parse_server_args


@pytest.mark.parametrize(
    ("value", "want"),
    [("on", "on"), ("enabled", "on"), ("true", "on"), ("1", "on"), ("off", "off"),
     ("disabled", "off"), ("false", "off"), ("0", "off"), ("auto", "auto"), ("-1", "auto")],
)  # fmt: skip
def test_reasoning_spellings(value: str, want: str) -> None:
    assert parse_server_args(["-rea", value]).reasoning == want
    assert parse_server_args(["--reasoning", value]).reasoning == want


def test_defaults_and_kwargs(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = parse_server_args([])
    assert (cfg.reasoning, cfg.prefill_assistant) == ("auto", True)
    assert cfg.chat_template_kwargs == {"preserve_reasoning": True}
    cfg = parse_server_args(["--no-prefill-assistant", "--no-reasoning-preserve"])
    assert not cfg.prefill_assistant and cfg.chat_template_kwargs == {"preserve_reasoning": False}
    kw = '{"preserve_reasoning": false, "x": 1}'
    cfg = parse_server_args(["--chat-template-kwargs", kw, "--reasoning-effort", "low"])
    assert cfg.chat_template_kwargs == {
        "preserve_reasoning": False,
        "x": 1,
        "reasoning_effort": "low",
    }
    kw = '{"reasoning_effort": "high"}'
    cfg = parse_server_args(["--chat-template-kwargs", kw, "--reasoning-effort", "default"])
    assert cfg.chat_template_kwargs == {"preserve_reasoning": True}
    with pytest.raises(SystemExit):
        parse_server_args(["-rea", "maybe"])
    assert "unknown value for --reasoning" in capsys.readouterr().err


def test_parsing_flags() -> None:
    """`--reasoning-budget-message` (none by default) and `--[no-]skip-chat-parsing`."""
    cfg = parse_server_args([])
    assert (cfg.reasoning_budget, cfg.reasoning_budget_message) == (-1, "")
    assert not cfg.skip_chat_parsing
    cfg = parse_server_args(["--reasoning-budget", "5", "--reasoning-budget-message", "Done."])
    assert (cfg.reasoning_budget, cfg.reasoning_budget_message) == (5, "Done.")
    assert parse_server_args(["--skip-chat-parsing"]).skip_chat_parsing
    off = parse_server_args(["--skip-chat-parsing", "--no-skip-chat-parsing"])
    assert not off.skip_chat_parsing
