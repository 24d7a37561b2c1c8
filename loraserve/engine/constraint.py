"""Constrained generation: a request's grammar as a token mask, with llguidance.

Why llguidance (1.9.1): it is what llama.cpp itself can use (`%llguidance` grammars), it
reads GBNF (through its Lark converter), JSON schemas and regexes into one grammar form, and
its masks cost little on a large vocabulary: measured on Gemma 3's 262,144 tokens (2 cores,
`scripts/grammar_mask_cost.py`) a mask takes ~20-110 us per token for JSON schemas and GBNF,
far below a decode step (~20 ms), with no per-grammar compilation step over the vocabulary
(xgrammar compiles each grammar against the whole vocabulary first; outlines-core builds an
index per regex that grows with the vocabulary and cannot take a context-free grammar).

`Grammars` holds the vocabulary in llguidance's form (built once, on first use, ~1 s for
262,144 tokens); `compile` turns a request's grammar into llguidance's text or says why it
is invalid; `Constraint` is one request's matcher on the engine thread: `mask` forbids the
tokens the grammar does not allow next (in place, on the logits row), `accept` advances it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
import numpy as np
import torch

from loraserve.engine.budget import BudgetSpec, ReasoningBudget
from loraserve.model.tokenizer import Tokenizer

GrammarKind = Literal["gbnf", "json_schema", "lark"]
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types (GGUF tokenizer.ggml.token_type)


@dataclass(frozen=True)
class GrammarSpec:
    """What a request asks for: GBNF text, a JSON schema (as JSON text), or llguidance's
    Lark text (the tool-call grammars of `chat/formats/grammar.py`)."""

    kind: GrammarKind
    text: str


def _token_bytes(tok: Tokenizer) -> list[bytes]:
    """Each token's bytes; special tokens marked with a leading 0xff (llguidance's rule for
    llama.cpp vocabularies: CONTROL, and USER_DEFINED tokens that look like ``<...>``)."""
    types = getattr(tok, "_types", None) or [0] * tok.vocab_size  # tokenizer internals
    out = []
    for i in range(tok.vocab_size):
        b = tok.token_bytes(i)
        if types[i] == CONTROL or (types[i] == USER_DEFINED and b[:1] == b"<" and b[-1:] == b">"):
            b = b"\xff" + b
        out.append(b)
    return out


class _Vocab:
    """The duck-typed tokenizer `llguidance.TokenizerWrapper` reads."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else 0
        self.bos_token_id = tok.bos_id
        self.tokens = _token_bytes(tok)
        self.special_token_ids = [i for i, b in enumerate(self.tokens) if b[:1] == b"\xff"]
        self.single = {b[0]: i for i, b in enumerate(self.tokens) if len(b) == 1}  # byte tokens

    def __call__(self, text: bytes | str) -> list[int]:
        """The text's tokens as they continue a sequence: without SentencePiece's dummy
        space prefix (llguidance tokenizes pieces of an answer, never a whole prompt)."""
        s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        fragment = getattr(self.tok, "_encode_fragment", None)  # tokenizer internals
        if fragment is not None:
            ids = list(fragment(s, False))
        else:
            ids = self.tok.encode(s, add_special=False, parse_special=False)
        data = s.encode()
        if b"".join(self.tokens[i] for i in ids) == data:
            return ids
        # SentencePiece reads a written U+2581 as its space: byte tokens keep the bytes
        if all(b in self.single for b in data):
            return [self.single[b] for b in data]
        return ids


class Grammars:
    """A model's vocabulary in llguidance's form, shared by every request (thread-safe)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self._lltok: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def lltok(self) -> llguidance.LLTokenizer:
        """llguidance's tokenizer, built on first use."""
        with self._lock:
            if self._lltok is None:
                eos = sorted(self.tok.eog_ids) or [self.tok.eos_id or 0]
                wrapper = llguidance.TokenizerWrapper(_Vocab(self.tok))
                self._lltok = llguidance.LLTokenizer(wrapper, eos_token=eos)
            return self._lltok

    def compile(self, spec: GrammarSpec) -> str:
        """llguidance's grammar text for ``spec``; ValueError naming what is wrong."""
        if spec.kind == "json_schema":
            try:
                schema: Any = json.loads(spec.text)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
            if not isinstance(schema, dict | bool):
                raise ValueError("a JSON schema must be an object (or true/false)")
            try:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    schema, defaults={"whitespace_flexible": False}
                )
            except (ValueError, TypeError) as e:
                raise ValueError(f"invalid JSON schema: {e}") from None
        else:
            try:
                grammar = llguidance.grammar_from(spec.kind, spec.text)
            except (ValueError, TypeError) as e:
                raise ValueError(f"invalid grammar: {e}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar, self.lltok)
        if error and not error.startswith("WARNING"):
            what = "JSON schema" if spec.kind == "json_schema" else "grammar"
            raise ValueError(f"invalid {what}: {error.strip()}")
        return grammar


class Constraint:
    """One request's grammar state (engine thread), with its reasoning budget when it has
    one (`engine.budget`): a forced token then overrides the grammar's mask, and a budget
    alone constrains nothing else."""

    def __init__(
        self, grammars: Grammars, grammar: str | None, spec: BudgetSpec | None = None
    ) -> None:
        lltok = grammars.lltok
        self.budget = ReasoningBudget(spec, grammars.tok.token_bytes) if spec else None
        self.matcher = llguidance.LLMatcher(lltok, grammar, log_level=0) if grammar else None
        self.vocab = lltok.vocab_size
        self._bits = torch.full(((self.vocab + 31) // 32,), -1, dtype=torch.int32)

    def mask(self, row: torch.Tensor) -> None:
        """Set to -inf the logits [V] of the tokens the grammar does not allow next."""
        forced = self.budget.forced if self.budget is not None else None
        if forced is not None:
            values = row.numpy() if row.dtype == torch.float32 and row.is_contiguous() else None
            if values is not None:  # the row's memory (an inference tensor refuses torch's)
                keep = float(values[forced])
                values[:] = -np.inf
                values[forced] = keep
            else:
                with torch.inference_mode():
                    keep_t = row[forced].clone()
                    row.fill_(float("-inf"))
                    row[forced] = keep_t
        elif self.matcher is not None:
            self.apply(row, self.compute())

    def compute(self) -> torch.Tensor:
        """The allowed next tokens as llguidance's bitmask [ceil(V / 32)] int32."""
        bits = self._bits
        if self.matcher is not None:
            self.matcher.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
        return bits

    def apply(self, row: torch.Tensor, bits: torch.Tensor) -> None:
        """Forbid in ``row`` [V] the tokens whose bit is 0 (numpy's masked copy on the row's
        memory: 50-150 us on 262,144 tokens, where torch's masked_fill_ takes ~400 us)."""
        n = min(row.shape[0], self.vocab)
        allowed = np.unpackbits(bits.numpy().view(np.uint8), count=n, bitorder="little")
        banned = ~allowed.view(np.bool_)
        if row.dtype == torch.float32 and row.is_contiguous():
            values = row.numpy()
            np.copyto(values[:n], -np.inf, where=banned)
            values[n:] = -np.inf
        else:
            row[:n].masked_fill_(torch.from_numpy(banned), float("-inf"))
            row[n:] = float("-inf")

    def accept(self, token: int) -> bool:
        """Advance past ``token``; False if the grammar refuses it."""
        if self.budget is not None:
            self.budget.accept(token)
        return self.matcher is None or bool(self.matcher.consume_token(token))

    @property
    def finished(self) -> bool:
        """Whether the grammar allows nothing more (the request should stop)."""
        return self.matcher is not None and bool(self.matcher.is_stopped())

    @property
    def error(self) -> str:
        """Why the matcher failed (empty if it did not)."""
        m = self.matcher
        return m.get_error() if m is not None and m.is_error() else ""
