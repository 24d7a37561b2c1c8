"""Property test of the cache-key invariant over random operation sequences (HTTP).

Operations: set the global mix; completions with and without `lora` (empty lists, zero
scales, repeated ids); shared and diverging prefixes; cache_prompt on and off; `id_slot`;
concurrent requests across slots; adapter load, unload and reload of changed weights under
the same name; an aLoRA adapter (`inv`, active from its invocation [41, 42] on: before it,
positions run under the rest of the mix, so their KV is shared with that mix's requests);
slot save and restore. Every greedy completion must equal the same request run alone with
the cache off, and `cache_n` must equal the longest prefix computed under the same key at
every position that is still retained (the budget is unlimited, so retained = computed,
minus what unloading an adapter dropped). The same holds with speculative decoding on.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraserve.engine.engine import Engine, EngineConfig
from loraserve.engine.sampling.params import SamplingParams
from tests.engine_util import run_one
from tests.server_util import concurrently, peft_folder, serve_in_thread, tiny_model

FILES = ("a", "b", "a2", "inv")  # a2: the same name as a, changed weights; inv: an aLoRA
INV = [41, 42]
BS = 16  # the server's KV block size
PREFIXES = ([1, 40, 41, 42, 43, 44, 45, 46], [1, 40, 41, 42, 50, 51], [1, 60, 61, 62, 63, 64, 65])
N_PREDICT = 4


@functools.cache
def adapter_dir() -> Path:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="loraserve-prop-"))
    for name, seed in (("a", 21), ("b", 22), ("a2", 23), ("inv", 24)):
        peft_folder(d / name, seed)
    conf = json.loads((d / "inv" / "adapter_config.json").read_text())
    (d / "inv" / "adapter_config.json").write_text(
        json.dumps({**conf, "alora_invocation_tokens": INV})
    )
    return d


@functools.cache
def reference_engine() -> tuple[Engine, dict[str, int]]:
    eng = Engine(tiny_model(), EngineConfig(n_ctx=256, cache_ram_mib=0))
    ids = {f: eng.load_adapter(adapter_dir() / f, 0.0).result().id for f in FILES}
    return eng, ids


@functools.cache
def reference(prompt: tuple[int, ...], mix: tuple[tuple[str, float], ...]) -> tuple[int, ...]:
    """Greedy tokens of the request alone, cache off."""
    eng, ids = reference_engine()
    lora = [(ids[f], s) for f, s in mix]
    greedy = SamplingParams(temperature=0.0, ignore_eos=True)  # as the requests ask
    return tuple(run_one(eng, list(prompt), N_PREDICT, lora, sampling=greedy, cache_prompt=False))


scales = st.sampled_from([0.0, 0.5, 1.0, -1.0])
completion = st.fixed_dictionaries(
    {
        "prefix": st.integers(0, len(PREFIXES) - 1),
        "cut": st.integers(2, 8),
        "suffix": st.lists(st.integers(3, 319), max_size=5),
        "lora": st.one_of(
            st.none(),
            st.just([]),
            # the global mix without the aLoRA adapter, and with it alone: their KV is
            # shared before its invocation (and everywhere in a prompt without one)
            st.sampled_from([[(0, 1.0), (1, 1.0)], [(2, 1.0)], [(0, 1.0), (1, 1.0), (2, 0.5)]]),
            st.lists(st.tuples(st.integers(0, 3), scales), min_size=1, max_size=3),
        ),
        "cache_prompt": st.booleans(),
        "id_slot": st.sampled_from([-1, -1, 0, 1]),
    }
)
op = st.one_of(
    st.tuples(st.just("complete"), completion),
    st.tuples(st.just("concurrent"), st.tuples(completion, completion)),
    st.tuples(st.just("global"), st.lists(st.tuples(st.integers(0, 3), scales), max_size=3)),
    st.tuples(st.just("unload"), st.integers(0, 3)),
    st.tuples(st.just("load"), st.sampled_from(FILES)),
    st.tuples(st.just("save"), st.integers(0, 1)),
    st.tuples(st.just("restore"), st.integers(0, 1)),
)


class Model:
    """What the server should hold: adapters by id (their files and names), global scales,
    retained KV by key."""

    def __init__(self) -> None:
        self.loaded: dict[int, str] = {}
        self.names: dict[int, str] = {}
        self.next_id = 0
        self.glob: dict[int, float] = {}
        self.retained: list[tuple[tuple, tuple[int, ...]]] = []
        self.slot_last: dict[int, tuple[tuple, tuple[int, ...]]] = {}
        self.saved: dict[int, tuple[tuple, tuple[int, ...]]] = {}

    def mix(
        self, lora: list[tuple[int, float]] | None, drop_inv: bool = False
    ) -> tuple[tuple[str, float], ...]:
        chosen = dict(lora) if lora else dict(self.glob)
        total: dict[str, float] = {}
        for i, s in chosen.items():
            if s and not (drop_inv and self.loaded[i] == "inv"):
                total[self.loaded[i]] = total.get(self.loaded[i], 0.0) + s
        return tuple(sorted((f, s) for f, s in total.items() if s))

    def keys(self, lora: list[tuple[int, float]] | None, prompt: list[int], n: int) -> tuple:
        """The key of each of the first ``n`` positions: the mix, without the aLoRA adapter
        before the last invocation in the prompt (and everywhere without one)."""
        starts = [i for i in range(len(prompt) - 1) if prompt[i : i + 2] == INV]
        start = starts[-1] if starts else n
        before, after = self.mix(lora, drop_inv=True), self.mix(lora)
        return tuple(before if p < start else after for p in range(n))

    def expected_cache_n(self, keys: tuple, prompt: list[int]) -> int:
        best = 0
        for k, toks in self.retained:
            n = 0
            while n < min(len(prompt) - 1, len(toks)) and toks[n] == prompt[n] and k[n] == keys[n]:
                n += 1
            best = max(best, n)
        return best


def run_completion(srv, m: Model, c: dict, check_cache: bool) -> None:
    prompt = PREFIXES[c["prefix"]][: c["cut"]] + c["suffix"]
    lora = c["lora"]
    if lora and (
        any(i not in m.loaded for i, _ in lora) or len({i for i, _ in lora}) < len(lora)
    ):  # unknown or repeated ids: a clear 400 naming the id
        body = {"prompt": prompt, "lora": [{"id": i, "scale": s} for i, s in lora]}
        assert srv.client.post("/completion", json=body).status_code == 400
        return
    key = m.mix(lora)
    keys = m.keys(lora, prompt, len(prompt) + N_PREDICT)
    expect_n = m.expected_cache_n(keys, prompt) if c["cache_prompt"] else 0
    body = {
        "prompt": prompt,
        "n_predict": N_PREDICT,
        "temperature": 0,
        "ignore_eos": True,
        "return_tokens": True,
        "cache_prompt": c["cache_prompt"],
        "id_slot": c["id_slot"],
    }
    if lora is not None:
        body["lora"] = [{"id": i, "scale": s} for i, s in lora]
    r = srv.client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["tokens_evaluated"] == len(prompt)
    assert tuple(res["tokens"]) == reference(tuple(prompt), key), "output differs from cache-off"
    if check_cache:
        assert res["timings"]["cache_n"] == expect_n
        assert res["timings"]["prompt_n"] == len(prompt) - expect_n
    computed = (keys, tuple(prompt + res["tokens"][:-1]))
    m.retained.append(computed)
    m.slot_last[res["id_slot"]] = computed


# speculative decoding (issue 15) with drafts as long as the requests allow, so that drafts are
# verified, partly rejected and rolled back under every operation above
SPEC = (
    "--spec-type ngram-simple,ngram-mod --spec-ngram-simple-size-n 1 --spec-ngram-simple-size-m 3"
)
SPEC += " --spec-ngram-mod-n-match 1 --spec-ngram-mod-n-min 1 --spec-ngram-mod-n-max 3"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("spec", [[], SPEC.split()], ids=["spec-off", "spec-on"])
@settings(
    max_examples=int(os.environ.get("LORASERVE_PROP_EXAMPLES", 20)),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(st.lists(op, min_size=1, max_size=10))
def test_every_answer_equals_cache_off_and_cache_n_is_exact(tmp_path_factory, spec, ops) -> None:
    d = adapter_dir()
    slots = tmp_path_factory.mktemp("slots")
    args = [
        "-np",
        "2",
        "-c",
        "512",
        "--cache-ram",
        "-1",
        "--lora-dir",
        str(d),
        "--slot-save-path",
        str(slots),
        "--lora",
        str(d / "a"),
        "--lora",
        str(d / "b"),
        "--lora",
        str(d / "inv"),
        *spec,
    ]
    m = Model()
    m.loaded, m.next_id, m.glob = {0: "a", 1: "b", 2: "inv"}, 3, {0: 1.0, 1: 1.0, 2: 1.0}
    m.names = dict(m.loaded)
    with serve_in_thread(args) as srv:
        for kind, arg in ops:
            if kind == "complete":
                run_completion(srv, m, arg, check_cache=True)
            elif kind == "concurrent":
                concurrently(lambda c: run_completion(srv, m, c, check_cache=False), arg)
            elif kind == "global":
                body = [{"id": i, "scale": s} for i, s in arg]
                r = srv.client.post("/lora-adapters", json=body)
                ids = [i for i, _ in arg]
                if all(i in m.loaded for i in ids) and len(set(ids)) == len(ids):
                    assert r.status_code == 200
                    m.glob = {i: 0.0 for i in m.loaded} | dict(arg)
                else:
                    assert r.status_code == 400
            elif kind == "unload":
                r = srv.client.post("/lora-adapters/unload", json={"id": arg})
                if arg not in m.loaded:
                    assert r.status_code in (400, 404)
                    continue
                assert r.status_code == 200, r.text
                f = m.loaded.pop(arg)
                m.names.pop(arg)
                m.glob.pop(arg, None)
                if f not in m.loaded.values():  # its blocks go, and every block after them
                    m.retained = [_drop(k, t, f) for k, t in m.retained]
            elif kind == "load":
                # names are unique: a2 asks for a's name (refused while it is taken, else
                # a reload of changed weights under that name); a and b again get a suffix
                body = {"path": str(d / arg), "scale": 0.0}
                if arg == "a2":
                    body["name"] = "a"
                r = srv.client.post("/lora-adapters/load", json=body)
                if "a" in m.names.values() and arg == "a2":
                    assert r.status_code == 400 and "name" in r.json()["error"]["message"], r.text
                    continue
                assert r.status_code == 200, r.text
                assert r.json()["id"] == m.next_id
                assert r.json()["name"] not in m.names.values()
                m.names[m.next_id] = r.json()["name"]
                m.loaded[m.next_id] = arg
                m.glob[m.next_id] = 0.0
                m.next_id += 1
            elif kind == "save":
                r = srv.client.post(f"/slots/{arg}?action=save", json={"filename": f"s{arg}.bin"})
                assert r.status_code == 200, r.text
                if arg in m.slot_last:
                    m.saved[arg] = m.slot_last[arg]
            elif kind == "restore" and arg in m.saved:
                r = srv.client.post(
                    f"/slots/{1 - arg}?action=restore", json={"filename": f"s{arg}.bin"}
                )
                assert r.status_code == 200, r.text
                m.retained.append(m.saved[arg])
                m.slot_last[1 - arg] = m.saved[arg]


def _drop(keys: tuple, toks: tuple, f: str) -> tuple[tuple, tuple]:
    """What stays of a retained sequence once adapter file ``f`` is unloaded: the whole
    blocks before the first position computed with it."""
    first = next((p for p, k in enumerate(keys[: len(toks)]) if f in dict(k)), None)
    if first is None:  # never computed with it: every block stays
        return keys, toks
    keep = first // BS * BS
    return keys[:keep], toks[:keep]
