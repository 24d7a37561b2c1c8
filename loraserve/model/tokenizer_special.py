"""Special tokens as llama.cpp's llama_vocab sees them: types, end of generation, splitting.

At load llama.cpp retypes some tokens by their text (end-of-generation and FIM tokens become
CONTROL, a few become USER_DEFINED or NORMAL) and, for a few model families, makes special
tokens swallow the whitespace beside them (LSTRIP/RSTRIP). Before encoding it cuts the text of
every special token out of the input (`SpecialSplitter`).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Texts llama.cpp treats as end of generation (llama_vocab::impl::load); each is made CONTROL.
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
        "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
        "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    }
)  # fmt: skip
# Texts llama.cpp looks for when the GGUF does not give these ids; a token found is made CONTROL.
_DETECTED_TEXTS = {
    "eot": (
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
    ),
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
        "<|code_middle|>", "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip
_C_SPACE = frozenset(" \t\n\v\f\r")
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


_END = ""  # a trie node's key marking that the path to it spells a whole word


def _trie(words: Iterable[str]) -> dict[str, dict]:
    """Nested dicts, one level per character; `_END` in a node ends a word."""
    root: dict[str, dict] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[_END] = {}
    return root


class SpecialSplitter:
    """Cuts special-token texts out of a string, as llama.cpp's tokenizer_st_partition.

    llama.cpp takes the special tokens one by one, longest text first, and splits every
    still-raw fragment at each non-overlapping occurrence (left to right). Equivalently: take
    the occurrences of all texts in that order (token, then position) and claim each one that
    lies wholly in unclaimed text. Only the longest text at each position is queued at first;
    a shorter one starting there is queued when the longer is refused for reaching into a
    claim. LSTRIP / RSTRIP tokens also claim (drop) the whitespace beside them.
    Ties in length go by id (llama.cpp's std::sort leaves them unspecified).
    """

    def __init__(
        self, specials: dict[str, int], lstrip: Iterable[int] = (), rstrip: Iterable[int] = ()
    ):
        self._ids = specials
        self._lstrip, self._rstrip = frozenset(lstrip), frozenset(rstrip)
        # Occurrences: positions where a special text may start (its first characters, found
        # by a one-class regex), then the longest text there by walking a trie. A regex of the
        # whole trie matched the same but took 0.3 s to compile for Gemma's 6,414 specials.
        self._trie = _trie(specials)
        firsts = "".join(sorted(k for k in self._trie if k))
        self._starts = re.compile("[" + re.escape(firsts) + "]") if specials else None
        self._prefixes: dict[str, str | None] = {}

    def _shorter(self, word: str) -> str | None:
        """The longest special text that is a proper prefix of `word`."""
        if word not in self._prefixes:
            ids = self._ids
            self._prefixes[word] = next(
                (word[:n] for n in range(len(word) - 1, 0, -1) if word[:n] in ids), None
            )
        return self._prefixes[word]

    def split(self, text: str) -> list[str | int]:
        """The fragments of `text`: raw strings and special-token ids, in order."""
        if self._starts is None or not text:
            return [text] if text else []
        ids = self._ids
        # (-length, id, position): llama.cpp's token order, then left to right
        heap = []
        root, n = self._trie, len(text)
        for m in self._starts.finditer(text):
            pos = end = m.start()
            node, longest = root, -1
            while end < n:
                node = node.get(text[end])
                if node is None:
                    break
                end += 1
                if _END in node:
                    longest = end
            if longest > 0:
                word = text[pos:longest]
                heap.append((pos - longest, ids[word], pos, word))
        if not heap:
            return [text]
        heapq.heapify(heap)
        # claimed[i]: character i belongs to a claim (a token's text or the whitespace it
        # strips). Checking and marking cost the claim's length, so the split is linear in
        # the text (times the longest special text), however the claims interleave.
        claimed = bytearray(n)
        claims: list[tuple[int, int, int]] = []  # (begin, end, id)
        while heap:
            neg_size, tid, pos, word = heapq.heappop(heap)
            if claimed[pos]:
                continue  # every text starting here overlaps that claim too
            end = pos - neg_size
            if claimed.find(1, pos, end) >= 0:
                shorter = self._shorter(word)
                if shorter is not None:
                    heapq.heappush(heap, (-len(shorter), ids[shorter], pos, shorter))
                continue
            begin = pos
            if tid in self._lstrip:
                while begin > 0 and not claimed[begin - 1] and text[begin - 1] in _C_SPACE:
                    begin -= 1
            if tid in self._rstrip:
                while end < n and not claimed[end] and text[end] in _C_SPACE:
                    end += 1
            claimed[begin:end] = b"\x01" * (end - begin)
            claims.append((begin, end, tid))
        out: list[str | int] = []
        cursor = 0
        for begin, end, tid in sorted(claims):
            if begin > cursor:
                out.append(text[cursor:begin])
            out.append(tid)
            cursor = end
        if cursor < len(text):
            out.append(text[cursor:])
        return out


def mark_special_tokens(
    texts: list[str],
    types: list[int],
    token_id: Callable[[str, int | None], int | None],
    eos: int | None,
) -> set[int]:
    """End-of-generation ids, retyping tokens in `types` as llama_vocab::impl::load does."""
    wanted = EOG_TEXTS.union(*_DETECTED_TEXTS.values(), _ALWAYS_RENDERED)
    by_text = {t: i for i, t in enumerate(texts) if t in wanted}
    found: dict[str, int | None] = {}
    for kind, candidates in _DETECTED_TEXTS.items():
        found[kind] = token_id(kind, None)
        if found[kind] is None:
            found[kind] = next((by_text[t] for t in candidates if t in by_text), None)
            if found[kind] is not None:
                types[found[kind]] = CONTROL
    eog: set[int | None] = {found["fim_pad"], found["fim_rep"], found["fim_sep"]}
    for text in EOG_TEXTS.intersection(by_text):
        eog.add(by_text[text])
        types[by_text[text]] = CONTROL
    for text in _ALWAYS_RENDERED:
        if text in by_text:
            types[by_text[text]] = USER_DEFINED
    eog |= {eos, found["eot"], found["eom"]}
    eog_texts = {texts[i]: i for i in eog if i is not None}
    has_call = "<|call|>" in eog_texts or "<|calls|>" in eog_texts
    if (
        "<|end|>" in eog_texts
        and has_call
        and ("<|return|>" in eog_texts or "<|flush|>" in eog_texts)
    ):
        types[eog_texts.pop("<|end|>")] = USER_DEFINED
    if "</s>" in eog_texts and ("<|tool_response>" in eog_texts or "<|plamo:eos|>" in eog_texts):
        types[eog_texts.pop("</s>")] = NORMAL
    return set(eog_texts.values())


def strip_ids(
    texts: list[str], types: list[int], name: str, pre: str, arch: str
) -> tuple[set[int], set[int]]:
    """Ids whose special text swallows the whitespace on its left / right (LSTRIP / RSTRIP).

    llama.cpp sets these by model family: the mask token of jina-v2, nomic-bert-moe,
    jina-bert-v3 and modern-bert; every special token but <unk>, <s>, <|endoftext|> in Phi-3.
    """
    ids = {t: i for i, t in enumerate(texts) if t in ("<mask>", "[MASK]", "</s>")}
    name = name.lower()
    if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        a in arch for a in ("nomic-bert-moe", "jina-bert-v3")
    ):
        return {ids["<mask>"]} if "<mask>" in ids else set(), set()
    if "phi-3" in name or "phi3" in name:
        rstrip = {i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN)}
        rstrip |= {ids["</s>"]} if "</s>" in ids else set()
        return set(), {i for i in rstrip if texts[i] not in ("<unk>", "<s>", "<|endoftext|>")}
    if "modern-bert" in name:
        return {ids["[MASK]"]} if "[MASK]" in ids else set(), set()
    return set(), set()
