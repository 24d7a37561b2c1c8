"""`loraserve merge` under bad input: each case is one line naming the problem, exit status
1 (or 2 for a bad flag), and no file written, not even a temporary one (inputs written in the
test, as in test_merge.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraserve.lora.merge_cli import main
from tests.server_util import write_peft
from tests.tiny import hf_model, write_gguf
from tests.unit.lora.lora_util import gguf_from_pairs, random_pairs


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Inputs for the error cases: llama (GGUF r4, r6; PEFT), gemma3, another llama shape."""
    d = tmp_path_factory.mktemp("bad")
    llama, gemma, other = (
        hf_model("llama"),
        hf_model("gemma3", num_hidden_layers=2),
        hf_model("llama", hidden_size=32, seed=1),
    )
    zero = {k: (a, torch.zeros_like(b)) for k, (a, b) in random_pairs(llama, 4, 0).items()}
    write_peft(d / "lp", random_pairs(llama, 4, 3), 4, 8.0)
    main([str(d / "lp"), "--mode", "cat", "-o", str(d / "lpa"), "--arch", "llama"])
    (d / "notes.txt").write_text("not an adapter")
    return {
        "lpa": d / "lpa",
        "l4": gguf_from_pairs(d / "l4.gguf", llama, "llama", random_pairs(llama, 4, 1), 8.0),
        "l6": gguf_from_pairs(d / "l6.gguf", llama, "llama", random_pairs(llama, 6, 2), 8.0),
        "lp": d / "lp",
        "g4": gguf_from_pairs(d / "g4.gguf", gemma, "gemma3", random_pairs(gemma, 4, 4), 8.0),
        "o4": gguf_from_pairs(d / "o4.gguf", other, "llama", random_pairs(other, 4, 5), 8.0),
        "zero": gguf_from_pairs(d / "zero.gguf", llama, "llama", zero, 8.0),
        "model": write_gguf(d / "model.gguf", llama, "llama"),
        "txt": d / "notes.txt",
        "dir": d,
    }


BAD = [  # (arguments, with {name} for the paths in `files`, exit status, message)
    ("{dir}/missing.gguf:0.5 {l4}", 1, "no such adapter file or folder"),
    ("{txt}:1 {l4}", 1, "not a GGUF LoRA file or PEFT folder"),
    ("{model} {l4}", 1, "not a LoRA adapter"),
    ("{l4}:0.5 {g4}:0.5", 1, "different base architectures"),
    ("{lpa} {g4}", 1, "different base architectures (" + "{lpa}: llama, {g4}: gemma3)"),
    ("{l4}:0.5 {o4}:0.5", 1, "the adapters are for different base models"),
    ("{l4} {l6} --rank 11", 1, "--rank 11 is larger than possible: every merged delta has rank at "
     "most 10"),
    ("{l4}:0 {l6}:0.0", 1, "all weights are zero"),
    ("{zero}:1 {l4}:0", 1, "the weighted sum is zero for every target"),
    ("{l4}:0.5 {l6}:half", 1, "the weight after ':' must be a number"),
    ("{l4} {l6} --mode linear", 1, ": linear mode needs equal ranks, got [4, 6]"),
    ("{l4} {lp}", 1, "needs the head counts: pass --model"),
    ("{lp}", 1, "the base architecture is unknown"),
    ("{l4} {l6} --mode cat --rank 4", 2, "--rank applies to --mode ortho-svd only"),
    ("{l4} {l6} --rank 0", 2, "argument --rank: must be a positive integer or 'auto', got '0'"),
    ("{l4} {l6} --rank auto --energy 1.5", 2, "argument --energy: must be a number in (0, 1]"),
    ("{l4} {l6} --model {model} --format peft -o {dir}", 1, "is not a PEFT adapter folder"),
]  # fmt: skip


@pytest.mark.parametrize("args,status,message", BAD)
def test_bad_input_is_a_clear_error_and_writes_nothing(
    files, tmp_path, capsys, args, status, message
):
    argv, message = args.format(**files).split(), message.format(**files)
    if "-o" not in argv:
        argv += ["-o", str(tmp_path / "out.gguf")]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == status
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("loraserve merge: error: ") and message in last, err
    assert status == 2 or err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
    assert not [p for p in files["dir"].iterdir() if p.name.startswith(".")]
