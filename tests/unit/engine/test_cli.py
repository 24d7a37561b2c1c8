"""`loraserve generate` and the command dispatch, on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraserve.cli import main
from tests.server_util import peft_folder, tiny_model_path


def test_generate_prints_prompt_and_continuation(capsys) -> None:
    main(["generate", "-m", str(tiny_model_path()), "-p", "the cat", "-n", "6", "--temp", "0"])
    out, err = capsys.readouterr()
    assert out.startswith("the cat") and len(out.strip()) > len("the cat")
    assert "generated 6 tok" in err


def test_generate_with_lora_changes_the_output(tmp_path, capsys) -> None:
    args = ["generate", "-m", str(tiny_model_path()), "-p", "the cat and", "-n", "8", "--temp", "0"]
    main(args)
    base = capsys.readouterr().out
    main([*args, "--lora", f"{peft_folder(tmp_path / 'a', 5)}:1.5"])
    assert capsys.readouterr().out != base


def test_generate_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        main(["generate", "-m", str(tiny_model_path())])  # no prompt
    with pytest.raises(SystemExit, match="model not found"):
        main(["generate", "-m", "/nonexistent/model.gguf", "-p", "x"])
    with pytest.raises(SystemExit):
        main(["generate", "-m", str(tiny_model_path()), "-p", "x", "--top-p", "2"])


def test_generate_rejects_a_bad_adapter(tmp_path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    with pytest.raises(SystemExit):
        main(["generate", "-m", str(tiny_model_path()), "-p", "x", "--lora", str(bad)])


def test_generate_checks_adapters_before_the_weights_load(monkeypatch, capsys) -> None:
    import loraserve.model.loader as loader

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the adapter was checked")

    monkeypatch.setattr(loader, "load_model", no_load)
    gemma = Path(__file__).resolve().parents[3] / "loraserve" / "adapters" / "uppercase.gguf"
    with pytest.raises(SystemExit):
        main(["generate", "-m", str(tiny_model_path()), "-p", "x", "--lora", str(gemma)])
    assert "architecture 'gemma3' does not match the model's 'llama'" in capsys.readouterr().err


def test_help_lists_every_command(capsys) -> None:
    """`loraserve --help` names every command the dispatch knows (`cli.COMMANDS`)."""
    from loraserve.cli import COMMANDS

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.split("commands:")[1].splitlines() if line.strip()}
    assert set(COMMANDS) <= listed, out
