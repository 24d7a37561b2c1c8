"""bench.decode_ab: the rounds alternate the servers' order, each round's ratio is its own two
runs', bad arguments are refused by name, and `--scan-form` reaches loraserve's command line
alone (no server is started here: `launch` and `s2_decode` are replaced by recording fakes)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import decode_ab
from bench.servers import ServerKind


def test_rounds_alternate_and_pair_their_ratios(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    speeds = {"llama-server": iter([10.0, 20.0, 10.0]), "loraserve": iter([11.0, 18.0, 15.0])}

    @contextmanager
    def launch(kind: str, argv: list[str], port: int, timeout: float) -> Any:
        yield SimpleNamespace(url=f"http://{kind}", proc=SimpleNamespace(pid=None))

    def s2(target: Any, n_prompt: int, n_predict: int, reps: int, cap: float) -> dict:
        name = target.url.removeprefix("http://")
        calls.append(name)
        return {"decode_tok_s": next(speeds[name])}

    monkeypatch.setattr(decode_ab, "launch", launch)
    monkeypatch.setattr(decode_ab, "s2_decode", s2)
    monkeypatch.setattr(decode_ab, "warm_up", lambda t: None)
    monkeypatch.setattr(decode_ab, "server_argv", lambda *a, **k: [])
    kinds = [ServerKind("llama-server", ()), ServerKind("loraserve", ())]
    res = decode_ab.rounds(kinds, Path("m.gguf"), 100, n_rounds=3, n_predict=4)
    assert calls == ["llama-server", "loraserve", "loraserve", "llama-server",
                     "llama-server", "loraserve"]  # fmt: skip
    assert res["ratios"] == pytest.approx([1.1, 0.9, 1.5])
    assert res["median_ratio"] == pytest.approx(1.1)
    assert res["median_tok_s"] == {"llama-server": 10.0, "loraserve": 15.0}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--archs", "nope"], "nope"),
        (["--rounds", "0"], "--rounds"),
        (["--scan-form", "blocky"], "--scan-form"),
    ],  # fmt: skip
)
def test_bad_arguments_are_named(argv: list[str], message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with pytest.raises(SystemExit):
        decode_ab.main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_scan_form_reaches_loraserve_only(form: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    seen: list[list[ServerKind]] = []

    def rounds(kinds: list[ServerKind], *a: Any) -> dict:
        seen.append(kinds)
        return {"median_tok_s": {"llama-server": 1.0, "loraserve": 1.0}, "ratios": [1.0],
                "median_ratio": 1.0, "other_cores_max": 0.0}  # fmt: skip

    monkeypatch.setattr("bench.peer.find_peer", lambda: Path("/nowhere/llama-server"))
    monkeypatch.setattr(decode_ab, "synth_model", lambda *a: Path("m.gguf"))
    monkeypatch.setattr(decode_ab, "rounds", rounds)
    decode_ab.main(["--archs", "qwen35", "--scan-form", form, "--out", str(tmp_path)])
    ((peer, ours),) = seen
    assert ours.name == "loraserve" and ours.extra == ("--scan-form", form)
    assert "--scan-form" not in peer.extra
    (out,) = tmp_path.glob("decode_ab_*.json")
    assert form in out.read_text()
