"""The stale-answer checker flags answers that differ from their cache-off reference."""

from __future__ import annotations

import json
from typing import Any

import httpx

from bench.stale import Answer, check_answers, common_prefix, http_reference, judge, reference_body

URL = "http://127.0.0.1:1"


class BuggyServer:
    """A fake llama-server with the bug of llama.cpp #30366: a request without `lora` reuses
    the slot's KV whatever mix computed it, so its answer follows the old mix."""

    def __init__(self) -> None:
        self.global_mix: dict[int, float] = {}
        self.slot: tuple[list[int], dict[int, float]] | None = None

    @staticmethod
    def text(prompt: list[int], mix: dict[int, float]) -> str:
        active = sorted((i, s) for i, s in mix.items() if s)
        return f"answer to {sum(prompt)} under {active}"

    def handle(self, request: httpx.Request) -> httpx.Response:
        body: dict[str, Any] = json.loads(request.content)
        if request.url.path == "/lora-adapters":
            self.global_mix = {x["id"]: x["scale"] for x in body}
            return httpx.Response(200, json={"success": True})
        prompt = body["prompt"]
        explicit = body.get("lora")
        mix = {x["id"]: x["scale"] for x in explicit} if explicit else dict(self.global_mix)
        cache_n = 0
        if body.get("cache_prompt", True) and self.slot is not None:
            old_prompt, old_mix = self.slot
            if old_prompt == prompt and (not explicit or old_mix == mix):
                cache_n, mix = len(prompt) - 1, old_mix
        self.slot = (prompt, mix)
        return httpx.Response(
            200, json={"content": self.text(prompt, mix), "timings": {"cache_n": cache_n}}
        )


def ask(client: httpx.Client, prompt: list[int], lora: list[dict] | None) -> Answer:
    body: dict[str, Any] = {"prompt": prompt, "n_predict": 8, "temperature": 0.0}
    if lora is not None:
        body["lora"] = lora
    r = client.post(f"{URL}/completion", json=body).json()
    effective = lora or client.get_global()  # type: ignore[attr-defined]
    return Answer("q", prompt, effective, 8, r["content"], r["timings"]["cache_n"])


class Client(httpx.Client):
    def get_global(self) -> list[dict]:
        return self._global

    def set_global(self, lora: list[dict]) -> None:
        self._global = lora
        self.post(f"{URL}/lora-adapters", json=lora).raise_for_status()


def test_checker_flags_the_stale_answer_after_a_global_switch() -> None:
    server = BuggyServer()
    with Client(transport=httpx.MockTransport(server.handle)) as client:
        a_mix = [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]
        b_mix = [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}]
        prompt = [2, 10, 11, 12]
        client.set_global(a_mix)
        first = ask(client, prompt, None)
        client.set_global(b_mix)
        stale = ask(client, prompt, None)
        explicit = ask(client, prompt, b_mix)
        report = check_answers([first, stale, explicit], http_reference(client, URL))
    assert [v.same for v in report.verdicts] == [True, False, True]
    assert report.checked == 3 and report.stale == 1 and report.differ_without_reuse == 0
    bad = report.verdicts[1]
    assert bad.cache_n == len(prompt) - 1
    assert bad.reference == BuggyServer.text(prompt, {1: 1.0})
    assert bad.answer == BuggyServer.text(prompt, {0: 1.0})
    summary = report.summary()
    assert summary["stale"] == 1 and summary["examples"][0]["label"] == "q"


def test_reference_is_cache_off_with_explicit_lora() -> None:
    seen: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"content": "ref"})

    answer = Answer("x", [1, 2, 3], [{"id": 0, "scale": 0.5}], 5, "ref", cache_n=2)
    with httpx.Client(transport=httpx.MockTransport(handle)) as client:
        report = check_answers([answer], http_reference(client, URL))
    assert report.stale == 0 and report.checked == 1
    assert seen == [reference_body(answer)]
    assert seen[0]["cache_prompt"] is False and seen[0]["temperature"] == 0.0
    assert seen[0]["lora"] == [{"id": 0, "scale": 0.5}] and seen[0]["n_predict"] == 5


def test_judge_and_counts() -> None:
    fresh = Answer("fresh", [1], [], 4, "abcX", cache_n=0)
    reused = Answer("reused", [1], [], 4, "abcY", cache_n=5)
    v = judge(reused, "abcd")
    assert not v.same and v.diverges_at == 3
    assert judge(reused, "abcY").same and judge(reused, "abcY").diverges_at == -1
    report = check_answers([fresh, reused], lambda a: "abcd")
    assert report.stale == 1 and report.differ_without_reuse == 1
    assert common_prefix("", "a") == 0 and common_prefix("ab", "ab") == 2


def test_checker_stops_when_told() -> None:
    calls = []
    answers = [Answer(str(i), [i], [], 1, "x") for i in range(5)]
    report = check_answers(answers, lambda a: calls.append(a) or "x", lambda: len(calls) < 2)
    assert report.checked == 2
