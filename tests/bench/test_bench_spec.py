"""bench.spec's pieces that need no server: the copy-heavy prompts (deterministic, and each
holds the span its answer copies) and the side-by-side report with its ratios."""

from __future__ import annotations

from bench.spec import copy_prompts, report


def test_copy_prompts_are_deterministic_and_copy_heavy() -> None:
    prompts = copy_prompts()
    assert prompts == copy_prompts() and prompts != copy_prompts(seed=1)
    assert len(prompts) == 6
    for p in prompts:
        if p.startswith("Text:"):
            example = p.split("\n")[0][len("Text: ") :]
            assert p.count(example) == 2  # the shot shows the copy
        elif p.startswith("Log:"):
            assert p.endswith("Copy:\n-") and p.count("\n- ") >= 12
        else:
            assert p.count("limit") >= 9 and p.endswith("```python\ndef")


def fake(tok_s: float, answers: list[tuple[int, ...]], drafts: int = 0, s2: float = 0) -> dict:
    return {"tok_s": tok_s, "answers": answers, "draft_n": drafts, "draft_n_accepted": drafts // 2,
            "s2_tok_s": s2}  # fmt: skip


def test_report_prints_the_three_ratios(capsys) -> None:
    a = [(1, 2), (3,)]
    report({
        "ours off": fake(50, a, s2=50), "ours on": fake(100, a, 10, s2=49),
        "peer off": fake(60, a), "peer ngram-mod": fake(80, [(1, 2), (4,)], 10),
        "peer ngram-simple": fake(70, a, 4),
    })  # fmt: skip
    out = capsys.readouterr().out
    assert "speculation on/off: 2.00x" in out
    assert "llama-server best (ngram-mod): 1.25x" in out
    assert "S2 (non-repetitive), speculation on/off: 0.98x" in out
    assert "| peer ngram-mod | 80.0 | 5/10 | 1/2 | - |" in out
