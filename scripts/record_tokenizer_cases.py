"""Record llama.cpp's tokenization of edge cases as test data for loraserve's tokenizer.

Runs llama.cpp's `llama-tokenize` over a corpus of edge cases for each vocabulary and writes
tests/data/tokenizer/<vocab>.json: every case's text, add_special, parse_special and the ids
llama.cpp returned, plus the bytes llama.cpp gives each token it emitted (token_to_piece with
special=true, as /detokenize) and the end-of-generation ids it logged at load.

Vocabularies: the real Gemma 3 270M GGUF, and tiny vocab-only GGUFs built here (committed next
to the data): a SentencePiece one with add_space_prefix true, and byte-level BPE ones with the
'gpt-2', 'llama-bpe', 'qwen2' and 'default' pre-tokenizers.

    python scripts/record_tokenizer_cases.py [--bin DIR] [--gemma PATH] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizer"
DEFAULT_BIN = Path("/opt/peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
DEFAULT_GEMMA = Path("/opt/models/gemma3-270m-q4_k_m.gguf")

SPM_USER_DEFINED = ["<tool_call>", "</tool_call>", "\n\n", "\t\t", "<br>", "<<", ">>", "<b>"]
SPM_CONTROL = ["<|im_start|>", "<|im_end|>", "<mask>", "<end_of_turn>"]
BPE_CONTROL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
BPE_USER_DEFINED = ["<think>", "</think>", "  \n"]

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no "
    "will more what up out about who can said them some could into time only other new "
    "tokenizer server model adapter cache request token batch prompt stream python llama "
    "gemma hello world I'm you're we've they'll she'd it's don't can't won't isn't"
).split()
FOREIGN = [
    "Привет мир", "Grüße aus Köln", "naïve café", "你好，世界", "こんにちは世界", "안녕하세요",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Γειά σου Κόσμε", "ǅemal",
]  # fmt: skip


def training_text() -> str:
    """A deterministic corpus to train the tiny vocabularies on."""
    rng = random.Random(1234)
    lines = []
    for _ in range(3000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 10 ** rng.randint(1, 6))))
        if rng.random() < 0.15:
            words.append(rng.choice(FOREIGN))
        sep = rng.choice([" ", " ", " ", "  ", "\t"])
        lines.append(sep.join(words) + rng.choice([".", ",", "!", "?", ":", ""]))
    lines += ["def f(x):\n    return x ** 2", "for (int i = 0; i < n; ++i) {\n\tfoo();\n}"] * 20
    return "\n".join(lines)


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


def build_tiny_spm(path: Path) -> None:
    """Train a small SentencePiece BPE model and write it as a vocab-only 'llama' GGUF."""
    import io

    import gguf
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text().splitlines()),
        model_writer=model,
        model_type="bpe",
        vocab_size=900,
        byte_fallback=True,
        character_coverage=0.995,
        user_defined_symbols=SPM_USER_DEFINED,
        control_symbols=SPM_CONTROL,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        split_digits=False,
        minloglevel=2,
    )
    proto = pb.ModelProto()
    proto.ParseFromString(model.getvalue())
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny-spm")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([p.piece for p in proto.pieces])
    writer.add_token_scores([p.score for p in proto.pieces])
    writer.add_token_types([int(p.type) for p in proto.pieces])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    _close(writer)


def build_tiny_bpe(path: Path, pre: str) -> None:
    """Train a small byte-level BPE with `tokenizers`; write it as a vocab-only 'gpt2' GGUF."""
    import gguf
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=BPE_CONTROL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text().splitlines(), trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])] + BPE_USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    types = [3 if t in BPE_CONTROL else 4 if t in BPE_USER_DEFINED else 1 for t in tokens]
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name(f"tiny-bpe-{pre}")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|begin_of_text|>"))
    writer.add_eos_token_id(tokens.index("<|end_of_text|>"))
    if pre == "qwen2":
        writer.add_add_bos_token(False)
    _close(writer)


def _close(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


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
        cmd = [str(self.exe.parent / "llama-server"), "-m", str(self.model), "--port", "18931",
               "-c", "1024", "-np", "1", "-t", "1", "--log-disable"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def _as_bytes(piece: str | list[int]) -> bytes:
    return piece.encode() if isinstance(piece, str) else bytes(piece)


def record(name: str, oracle: CliOracle, vocab_file: str, specials: list[str]) -> None:
    """Run every case of the corpus for one vocabulary and write <name>.json."""
    rng = random.Random(f"loraserve-tokenizer-{name}")
    cases, detok_texts = build_corpus(rng, specials)
    for i, case in enumerate(cases):
        case["ids"] = oracle.tokenize(case["text"], case["add_special"], case["parse_special"])
        if i % 200 == 0:
            print(f"{name}: {i}/{len(cases)}", file=sys.stderr)
    seen: dict[int, bytes] = {}
    for text in detok_texts:
        seen.update(oracle.pieces(text))
    if isinstance(oracle, ServerOracle):
        seen.update(oracle.detokenize(rng.sample(range(oracle.vocab_size), 3000)))
    header = {
        "vocab": vocab_file,
        "source": f"llama.cpp {type(oracle).__name__}; pieces: token_to_piece(special=true)",
        "eog_ids": oracle.eog_ids(),
        "pieces": {str(k): v.hex() for k, v in sorted(seen.items())},
    }
    lines = [json.dumps(case, ensure_ascii=False) for case in cases]
    text = json.dumps(header, ensure_ascii=False)[:-1] + ', "cases": [\n' + ",\n".join(lines)
    (DATA / f"{name}.json").write_text(text + "\n]}\n")
    print(f"{name}: {len(cases)} cases, {len(seen)} pieces", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", type=Path, default=DEFAULT_BIN)
    parser.add_argument("--gemma", type=Path, default=DEFAULT_GEMMA)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--rebuild-vocabs", action="store_true")
    args = parser.parse_args()
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
    if args.only is None or "gemma3" in args.only:
        gemma_specials = ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>",
                          "<end_of_turn>", "</s>", "<start_of_image>", "[multimodal]",
                          "<unused0>", "<table>", "</td>", "<unused6241>"]  # fmt: skip
        with ServerOracle(args.bin, args.gemma) as server:
            record("gemma3", server, args.gemma.name, gemma_specials)


if __name__ == "__main__":
    main()
