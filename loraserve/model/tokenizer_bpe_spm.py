"""SentencePiece-style BPE (GGUF 'gemma4', and the 'sarvam-moe' / 'granite-embed-multi-311m'
pre-tokenizers), as llama.cpp runs it.

Spaces become U+2581, the text is cut into runs of newlines and runs of anything else, and each
run is merged by rank over its UTF-8 characters (no byte-level mapping); a character no token
covers becomes its `<0xXX>` byte tokens. For 'gemma4' a run of newlines that is a token is taken
whole. `tokenizers`' BPE with byte fallback does the merging.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from loraserve.model.tokenizer_bpe import UNKNOWN_CHAR

# tokenizer.ggml.pre values of this kind -> (a newline run that is a token is taken whole,
# BOS added whatever the GGUF says)
SPM_STYLE_PRES = {
    "gemma4": (True, True),
    "granite-embed-multi-311m": (True, True),
    "sarvam-moe": (False, False),
}
_RUNS = re.compile(r"[^\n]+|\n+")


class SpmStyleBpe:
    """Token ids of one text fragment (no special tokens) for an SPM-style BPE vocabulary."""

    def __init__(self, texts: Sequence[str], merges: Sequence[str], pre: str):
        self.newline_words, self.force_bos = SPM_STYLE_PRES[pre]
        pairs = []
        for merge in merges:
            cut = merge.find(" ", 1)
            pairs.append((merge[:cut], merge[cut + 1 :]) if cut >= 0 else ("", ""))
        self._vocab = {text: i for i, text in enumerate(texts)}
        self._n = len(texts)
        vocab = {**self._vocab, UNKNOWN_CHAR: self._n}
        model = models.BPE(vocab, pairs, unk_token=UNKNOWN_CHAR, fuse_unk=False, byte_fallback=True)
        self._tok = Tokenizer(model)
        self._tok.pre_tokenizer = pre_tokenizers.Split(Regex(_RUNS.pattern), "isolated")

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (spaces escaped here)."""
        text = text.replace(" ", "\u2581")
        if self.newline_words and "\n" in text:
            ids: list[int] = []
            for run in _RUNS.findall(text):
                whole = self._vocab.get(run) if run[0] == "\n" else None
                if whole is not None:
                    ids.append(whole)
                else:
                    ids += self._tok.encode(run, add_special_tokens=False).ids
        else:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        n = self._n
        return [i for i in ids if i < n]
