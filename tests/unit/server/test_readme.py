"""The README keeps its two one-command recipes and shows every command, endpoint and flag
of ours with an example or a mention."""

from __future__ import annotations

from pathlib import Path

from loraserve.server.config.args import build_parser

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def test_install_commands() -> None:
    start = "pip install 'torch==2.13.0' -e '.[default-model]' && loraserve build-kernels"
    assert start + " && loraserve\n" in README
    test = "pip install 'torch==2.13.0' -e '.[test]' && python -m pytest -q\n"
    assert test in README
    ci = (Path(__file__).resolve().parents[3] / ".ci" / "run").read_text()
    assert ci.endswith(test), "CI must run exactly the README's test command"


def test_commands_endpoints_and_flags_of_ours_are_documented() -> None:
    for example in ("loraserve generate -p", "loraserve merge a.gguf", "/lora-adapters/load -d",
                    "/lora-adapters/unload -d", '"model": "uppercase"', '"n": 3',
                    "loraserve ray -m", "loraserve build-kernels"):  # fmt: skip
        assert example in README, example
    (ours,) = [g for g in build_parser()._action_groups if g.title == "loraserve flags"]
    for action in ours._group_actions:
        assert any(flag in README for flag in action.option_strings), action.option_strings
    for flag in ("--chat-template", "--chat-template-file", "--chat-template-kwargs", "--version"):
        assert flag in README, flag
