"""llama.cpp's tokenizer answers, read from its CLI tools or a running llama-server."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

from tokenizer_vocabs import (
    vocab_metadata,
    write_tiny_model,
)

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
