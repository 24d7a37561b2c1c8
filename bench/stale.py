"""The stale-answer checker: every greedy answer must equal its cache-off reference.

A server that reuses KV computed under another adapter configuration (llama.cpp #30366)
answers differently from the same request sent with `"cache_prompt": false` and an explicit
`lora` list, which always computes the prompt from scratch. The checker replays each
recorded request that way and compares. A differing answer that reused no KV
(`cache_n == 0`) cannot be stale-KV; it is counted, but apart, as `differ_without_reuse`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class Answer:
    """One greedy answer as the server gave it, with what is needed to replay it."""

    label: str
    prompt: list[int]
    lora: list[dict[str, float]]
    n_predict: int
    content: str
    cache_n: int = 0
    prompt_n: int = 0


@dataclass(frozen=True)
class Verdict:
    """An answer against its reference: `same` when equal; otherwise where they part."""

    label: str
    same: bool
    cache_n: int
    diverges_at: int
    answer: str
    reference: str


@dataclass
class StaleReport:
    """All verdicts of one run; `stale` counts differing answers that reused KV."""

    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def checked(self) -> int:
        return len(self.verdicts)

    @property
    def stale(self) -> int:
        return sum(not v.same and v.cache_n > 0 for v in self.verdicts)

    @property
    def differ_without_reuse(self) -> int:
        return sum(not v.same and v.cache_n == 0 for v in self.verdicts)

    def summary(self, examples: int = 3) -> dict[str, Any]:
        """Counts plus the first few differing verdicts, for the JSON results."""
        bad = [asdict(v) for v in self.verdicts if not v.same][:examples]
        return {
            "checked": self.checked,
            "stale": self.stale,
            "differ_without_reuse": self.differ_without_reuse,
            "examples": bad,
        }


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def judge(answer: Answer, reference: str) -> Verdict:
    """Compare one answer with its reference text."""
    same = answer.content == reference
    return Verdict(
        label=answer.label,
        same=same,
        cache_n=answer.cache_n,
        diverges_at=-1 if same else common_prefix(answer.content, reference),
        answer=answer.content,
        reference=reference,
    )


def check_answers(
    answers: Sequence[Answer],
    reference: Callable[[Answer], str],
    keep_going: Callable[[], bool] = lambda: True,
) -> StaleReport:
    """Judge each answer against `reference(answer)` while `keep_going()` says so."""
    report = StaleReport()
    for answer in answers:
        if not keep_going():
            break
        report.verdicts.append(judge(answer, reference(answer)))
    return report


def reference_body(answer: Answer) -> dict[str, Any]:
    """The cache-off replay of `answer`: same tokens, explicit `lora`, greedy, no reuse."""
    body: dict[str, Any] = {
        "prompt": answer.prompt,
        "n_predict": answer.n_predict,
        "temperature": 0.0,
        "cache_prompt": False,
    }
    if answer.lora:
        body["lora"] = answer.lora
    return body


def http_reference(client: httpx.Client, base_url: str) -> Callable[[Answer], str]:
    """A `reference` function that asks a running server for the cache-off answer."""

    def fetch(answer: Answer) -> str:
        r = client.post(f"{base_url}/completion", json=reference_body(answer))
        r.raise_for_status()
        return r.json()["content"]

    return fetch
