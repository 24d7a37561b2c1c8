"""No client freezes the server (issue 31 item 3): what scales with the body is bounded and
runs off the event loop, checked structurally (where the work ran, what it was given) and by
behaviour (/health answers while a huge prompt's tokenization is held on a barrier), never
by timing.

- `logit_bias` token texts: bounded in length and, once tokenized, in entries (a 400 naming
  the field); tokenized off the loop when large, and once per request (the answer's
  `generation_settings` reuses it);
- mixed prompts `["<text>", 5]`: sized by their strings (they were counted 8 characters);
- `/rerank`: the query tokenized once, not once per document, off the loop when large;
- the special-token splitter: the same split as llama.cpp's partition (an independent
  naive implementation here), in time linear in the text however the claims interleave.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraserve.model.tokenizer_special import _C_SPACE, SpecialSplitter
from loraserve.server.fields import MAX_BIAS_TEXT, MAX_LOGIT_BIAS
from tests.server_util import Served, on_loop, serve_in_thread

BIG = "the cat sat " * 4000  # 48,000 characters: past the off-loop threshold


@pytest.fixture(scope="module")
def srv() -> Iterator[Served]:
    with serve_in_thread(["-np", "2", "-c", "512", "--reranking"]) as s:
        yield s


@pytest.fixture()
def encodes(srv: Served, monkeypatch) -> list[tuple[str, bool]]:
    """(text, ran on the event loop) for every tokenizer.encode the server makes."""
    calls: list[tuple[str, bool]] = []
    tok = srv.app.state.server.engine.tokenizer
    real = tok.encode

    def spy(text: str, *a: Any, **kw: Any) -> list[int]:
        calls.append((text, on_loop()))
        return real(text, *a, **kw)

    monkeypatch.setattr(tok, "encode", spy)
    return calls


def test_logit_bias_text_length_is_bounded(srv: Served) -> None:
    r = srv.client.post(
        "/completion", json={"prompt": "x", "n_predict": 1, "logit_bias": {"a" * 300: 1.0}}
    )
    assert r.status_code == 400
    assert "logit_bias" in r.json()["error"]["message"]
    assert f"at most {MAX_BIAS_TEXT} characters" in r.json()["error"]["message"]
    assert len(r.text) < 2000  # the refusal does not echo the key


def test_logit_bias_entries_after_tokenizing_are_bounded(srv: Served, encodes) -> None:
    keys = {f"{i} " + "the cat " * 20: -1.0 for i in range(200)}  # ~40 tokens each
    r = srv.client.post("/completion", json={"prompt": "x", "n_predict": 1, "logit_bias": keys})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "logit_bias" in err["message"] and str(MAX_LOGIT_BIAS) in err["message"]
    bias_calls = [looped for text, looped in encodes if text in keys]
    assert bias_calls and not any(bias_calls)  # tokenized off the event loop


def test_logit_bias_texts_are_tokenized_once(srv: Served, encodes) -> None:
    keys = {"the": 2.0, "cat sat": -1.0}
    r = srv.client.post(
        "/completion", json={"prompt": "x", "n_predict": 2, "logit_bias": keys, "seed": 1}
    )
    assert r.status_code == 200, r.text
    assert sorted(t for t, _ in encodes if t in keys) == sorted(keys)  # once each
    tok = srv.app.state.server.engine.tokenizer
    want = [
        {"bias": b, "token": i}
        for t, b in keys.items()
        for i in tok.encode(t, add_special=False, parse_special=False)
    ]
    assert r.json()["generation_settings"]["logit_bias"] == want


def test_a_mixed_prompt_is_sized_by_its_text(srv: Served, encodes) -> None:
    r = srv.client.post("/completion", json={"prompt": [BIG, 5], "n_predict": 1})
    assert r.status_code == 400  # too long for the context, found off the loop
    assert [looped for text, looped in encodes if text == BIG] == [False]


def test_rerank_tokenizes_the_query_once(srv: Served, encodes) -> None:
    query = "which " + "cat " * 6000  # large: off the loop
    docs = [f"doc {i} the cat" for i in range(5)]
    r = srv.client.post("/rerank", json={"query": query, "documents": docs})
    assert r.status_code == 400  # the query alone passes a slot's context
    assert [looped for text, looped in encodes if text == query] == [False]
    query = "which cat"
    r = srv.client.post("/rerank", json={"query": query, "documents": docs})
    assert r.status_code == 200, r.text
    assert [t for t, _ in encodes].count(query) == 1


def test_health_answers_while_a_huge_prompt_is_tokenized(srv: Served, monkeypatch) -> None:
    """The huge prompt's tokenization is held on a barrier: /health answers meanwhile (it
    could not if the tokenization held the event loop)."""
    tok = srv.app.state.server.engine.tokenizer
    real = tok.encode
    entered, release = threading.Event(), threading.Event()

    def held(text: str, *a: Any, **kw: Any) -> list[int]:
        if text == BIG:
            entered.set()
            assert release.wait(60)
        return real(text, *a, **kw)

    monkeypatch.setattr(tok, "encode", held)
    status: list[int] = []
    big = threading.Thread(
        target=lambda: status.append(
            httpx.post(f"{srv.url}/completion", json={"prompt": BIG}, timeout=60).status_code
        )
    )
    big.start()
    try:
        assert entered.wait(60)
        health = httpx.get(f"{srv.url}/health", timeout=30)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert big.is_alive()  # still being prepared
    finally:
        release.set()
        big.join(60)
    assert status == [400]


# -- the special-token splitter ------------------------------------------------------------


def naive_partition(text: str, specials: dict[str, int], lstrip: set[int], rstrip: set[int]):
    """llama.cpp's tokenizer_st_partition, written plainly: special tokens by length
    (longest first, ties by id), each cutting every raw fragment at its non-overlapping
    occurrences left to right; LSTRIP/RSTRIP drop the whitespace next to it in that
    fragment."""
    frags: list[str | int] = [text]
    for word, tid in sorted(specials.items(), key=lambda kv: (-len(kv[0]), kv[1])):
        out: list[str | int] = []
        for frag in frags:
            if not isinstance(frag, str):
                out.append(frag)
                continue
            start = 0
            while (i := frag.find(word, start)) >= 0:
                left = frag[start:i]
                if tid in lstrip:
                    left = left.rstrip("".join(_C_SPACE))
                if left:
                    out.append(left)
                out.append(tid)
                start = i + len(word)
                if tid in rstrip:
                    while start < len(frag) and frag[start] in _C_SPACE:
                        start += 1
            if frag[start:]:
                out.append(frag[start:])
        frags = out
    return frags


SPECIALS = {"<s>": 1, "</s>": 2, "<|im_end|>": 3, "<|im": 4, "s>": 5, "ab": 7, "abc": 8}
ALPHABET = ["<", "s", ">", "/", "|", "im", "_end", " ", "\n", "a", "b", "c", "x"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join),
    st.sets(st.sampled_from(sorted(SPECIALS.values()))),
    st.sets(st.sampled_from(sorted(SPECIALS.values()))),
)
def test_splitter_is_llama_cpp_partition(text: str, lstrip: set[int], rstrip: set[int]) -> None:
    got = SpecialSplitter(SPECIALS, lstrip, rstrip).split(text)
    assert got == naive_partition(text, SPECIALS, lstrip, rstrip)


def test_splitter_on_interleaved_claims() -> None:
    """200,000 claims of two tokens interleaved (the shorter ones claimed last, between the
    longer ones: the case a sorted-list insertion made quadratic) split as the naive
    partition does."""
    rng = random.Random(3)
    text = "".join(rng.choice(["<s>", "</s>", " ", "x"]) for _ in range(200_000))
    split: Callable[[str], list] = SpecialSplitter({"<s>": 1, "</s>": 2}, [1], [2]).split
    assert split(text) == naive_partition(text, {"<s>": 1, "</s>": 2}, {1}, {2})
