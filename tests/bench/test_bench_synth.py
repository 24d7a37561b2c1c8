"""S8's pieces that need no server and no llama-quantize: the random-weights GGUF writer at a
tiny shape, the synth cache, the process-tree RSS sampler and S8's rows in the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import report, scaling, synth

gguf = pytest.importorskip("gguf")

TINY = synth.Shape("tiny", "Tiny", hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32,
                   ffn=96, sliding_window=16, context_length=256, rope_scaling=8.0)  # fmt: skip
TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "\u2581h\u00e9llo", "\n\n", "<0x00>", "x"]


def write_template(path: Path) -> Path:
    """A stand-in for the 270M file: Gemma 3 keys, a small vocabulary, one tensor."""
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name("Gemma 3 270m")
    w.add_size_label("270M")
    w.add_context_length(32768)
    w.add_embedding_length(640)
    w.add_block_count(18)
    w.add_head_count(4)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores([-1000.0, -1000.0, -1000.0, -1000.0, -1.5, -2.0, 0.0, -3.25])
    w.add_token_types([3, 3, 3, 2, 1, 4, 6, 1])
    w.add_bos_token_id(2)
    w.add_add_space_prefix(False)
    w.add_file_type(15)
    w.add_tensor("output_norm.weight", np.ones(640, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def test_tiny_shape_reads_back_with_shapes_metadata_and_tokenizer(tmp_path: Path) -> None:
    template = synth.read_template(write_template(tmp_path / "t.gguf"))
    out = synth.write_f16(tmp_path / "tiny.gguf", TINY, template)
    r = gguf.GGUFReader(out)
    got = {t.name: (tuple(int(d) for d in reversed(t.shape.tolist())), t.tensor_type.name)
           for t in r.tensors}  # fmt: skip
    want = synth.tensor_specs(TINY, len(TOKENS))
    assert list(got) == [name for name, _ in want]
    for name, shape in want:
        assert got[name] == (shape, "F32" if len(shape) == 1 else "F16"), name
    assert got["token_embd.weight"][0] == (len(TOKENS), 64)
    assert got["blk.1.attn_q.weight"][0] == (64, 64) and got["blk.1.attn_k.weight"][0] == (32, 64)
    assert field(r, "general.architecture") == "gemma3"
    assert field(r, "general.name") == "Gemma 3 Tiny random weights"
    assert field(r, "general.file_type") == 1
    expect = {"embedding_length": 64, "block_count": 2, "feed_forward_length": 96,
              "attention.head_count": 2, "attention.head_count_kv": 1,
              "attention.key_length": 32, "attention.value_length": 32,
              "attention.sliding_window": 16, "context_length": 256,
              "rope.scaling.type": "linear", "rope.scaling.factor": 8.0,
              "rope.freq_base": 1e6}  # fmt: skip
    for key, value in expect.items():
        assert field(r, f"gemma3.{key}") == pytest.approx(value), key
    assert field(r, "tokenizer.ggml.tokens") == TOKENS
    assert field(r, "tokenizer.ggml.scores")[-1] == -3.25
    assert field(r, "tokenizer.ggml.token_type") == [3, 3, 3, 2, 1, 4, 6, 1]
    assert field(r, "tokenizer.ggml.add_space_prefix") is False
    tensors = {t.name: np.asarray(t.data, np.float32) for t in r.tensors}
    norm, q = tensors["blk.0.attn_norm.weight"], tensors["blk.0.attn_q.weight"]
    assert abs(norm.mean() - 1.0) < 0.01 and 0.01 < norm.std() < 0.03
    assert abs(q.mean()) < 0.005 and 0.015 < q.std() < 0.025


def test_real_shapes() -> None:
    one, four = synth.SHAPES["1b"], synth.SHAPES["4b"]
    assert (one.hidden, one.layers, one.heads, one.kv_heads, one.head_dim, one.ffn) == (
        1152, 26, 4, 1, 256, 6912)  # fmt: skip
    assert (four.hidden, four.layers, four.heads, four.kv_heads, four.ffn) == (
        2560, 34, 8, 4, 10240)  # fmt: skip
    assert (one.sliding_window, four.sliding_window, four.rope_scaling) == (512, 1024, 8.0)
    params = sum(int(np.prod(s)) for _, s in synth.tensor_specs(one, 262144))
    assert 0.99e9 < params < 1.01e9  # Gemma 3 1B: 999,885,952


def test_synth_model_caches_and_drops_the_f16(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LORASERVE_SYNTH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(synth.SHAPES, "tiny", TINY)
    calls = []

    def fake_quantize(src: Path, dst: Path, qtype: str = "Q4_K_M", threads: int = 2) -> Path:
        calls.append(src)
        dst.write_bytes(src.read_bytes())
        return dst

    monkeypatch.setattr(synth, "quantize", fake_quantize)
    template = write_template(tmp_path / "t.gguf")
    path = synth.synth_model("tiny", template)
    assert path == synth.synth_path("tiny") and path.parent == tmp_path / "cache"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert not calls[0].exists()
    assert synth.synth_model("tiny", template) == path and len(calls) == 1


def test_tree_rss_counts_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        alone = scaling._tree_kib(child.pid)
        assert alone > 1000
        assert scaling._tree_kib(os.getpid()) >= alone
        rss = scaling.TreeRss(period=0.01)
        rss.start(child)
        peak = rss.stop()
        assert peak is not None and peak > 1
    finally:
        child.kill()
        child.wait()


def test_parse_models_and_cold_env(tmp_path: Path) -> None:
    assert scaling.parse_models("4B, 270m") == ("270m", "4b")
    with pytest.raises(ValueError):
        scaling.parse_models("1b,12b")
    env = scaling.cold_env(tmp_path)
    assert env["HOME"] == str(tmp_path)
    assert all(v.startswith(str(tmp_path)) for v in env.values())


LOAD = {"load1": 0.4, "load5": 0.5, "load15": 0.6, "nproc": 2}


def s8_run() -> dict:
    meta = {"timestamp": "2026-01-02 00:00:00", "load_before": LOAD, "load_after": LOAD,
            "plan": {"threads": 2},
            "models": {"270m": {"label": "270M", "file": "a.gguf", "file_mib": 241.0},
                       "1b": {"label": "1B", "file": "b.gguf", "file_mib": 769.0}}}  # fmt: skip
    ls = {"270m": {"peak_rss_mib": 900.0, "cold_start_s": 6.0, "warm_start_s": 3.0,
                   "prefill_tok_s": 600.0, "decode_tok_s": 30.0},
          "1b": {"peak_rss_mib": 2000.0, "cold_start_s": 12.0}}  # fmt: skip
    peer = {"270m": {"peak_rss_mib": 300.0, "cold_start_s": 1.0, "warm_start_s": 0.5,
                     "prefill_tok_s": 500.0, "decode_tok_s": 60.0}}  # fmt: skip
    return {
        "meta": meta,
        "servers": {
            "loraserve": {"s8": ls, "errors": {"s8-1b": "TimeoutError: x"}},
            "llama-server": {"s8": peer, "errors": {}},
        },
    }


def skeleton() -> dict:
    machine = {"cpu": "cpu", "python": "3.11", "torch": "2", "nproc": 2,
               "load_before": LOAD, "load_after": LOAD}  # fmt: skip
    return {"timestamp": "2026-01-02 00:00:00", "quick": False, "model": "m.gguf",
            "machine": machine, "config": {"threads": 2, "sweep_plan": []},
            "servers": {}, "s8_only": True}  # fmt: skip


def table(md: str) -> dict[str, str]:
    return {ln.split(" | ")[0].lstrip("| "): ln for ln in md.splitlines() if ln.startswith("|")}


def test_s8_rows_render_from_partial_results(tmp_path: Path) -> None:
    md = report.markdown(scaling.merge(skeleton(), s8_run()))
    rows = table(md)
    assert rows["S8 270M peak RSS MiB (lower better)"].endswith("| 900 | 300 | 3 |")
    assert rows["S8 270M decode tok/s (1 stream, 64 tokens)"].endswith("| 30 | 60 | 0.5 |")
    assert rows["S8 1B cold start s, empty caches (lower better)"].endswith("| 12 | - | - |")
    assert rows["S8 1B prefill tok/s (512-token prompt)"].endswith("| - | - | - |")
    assert not any(k.startswith("S1 ") for k in rows)
    assert "1B `b.gguf` (769 MiB)" in md and "s8-1b: TimeoutError" in md
    assert report.plot(scaling.merge(skeleton(), s8_run()), tmp_path / "p.png") is None
    assert "not reliable" not in md
    busy = s8_run()
    busy["servers"]["llama-server"]["s8"]["270m"]["other_cores"] = 0.8
    assert "(270M on llama-server: 0.80 cores)" in report.markdown(scaling.merge(skeleton(), busy))


def test_s8_merges_into_an_earlier_full_run(tmp_path: Path) -> None:
    base = {**skeleton(), "s8_only": False, "config": {"threads": 2, "sweep_plan": [[4, 0]]}}
    base["servers"] = {"loraserve": {"s1": {"prefill_tok_s": 650.0},
                                     "errors": {"s8-4b": "old", "s6": "kept"}}}  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(base))
    (tmp_path / "latest.md").write_text("table\n\nRaw results: `run.json`.\n")
    loaded = scaling.base_results(tmp_path)
    assert loaded == base and scaling.base_results(tmp_path / "none") is None
    merged = scaling.merge(loaded, s8_run())
    assert merged["servers"]["loraserve"]["errors"] == {"s6": "kept", "s8-1b": "TimeoutError: x"}
    rows = table(report.markdown(merged))
    assert rows["S1 prefill tok/s (512-token prompt)"].endswith("| 650 | - | - |")
    assert "S8 270M warm start s (lower better)" in rows
