"""llama.cpp's regex splitting (unicode_regex_split) for one list of regexes, run by `tokenizers`.

A regex naming a Unicode category runs, in llama.cpp, on a collapsed text where `\\p{Lu}` and the
like mean any letter; here the regex is widened the same way. Where the text holds a code point
llama.cpp gives no category, or (for a regex with a literal class holding one) a non-ASCII
space, the split runs on a copy with that code point replaced by one both sides see alike, and
the pieces are cut from the real text.
"""

from __future__ import annotations

import re
from functools import cache

from tokenizers import PreTokenizedString, Regex, pre_tokenizers

from loraserve.model.tokenizer_unicode import has_undefined, replace_undefined

_CATEGORY = re.compile(r"\\p\{L[ultmo]\}")
_SPACES = "\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
_SPACES += "\u2028\u2029\u202f\u205f\u3000"  # llama.cpp's non-ASCII whitespace
_STAND_IN = "\ufdd0"  # a noncharacter: no category in any Unicode version


def _collapse(regex: str) -> str:
    """The regex as llama.cpp's collapsed form reads it: each letter class is every letter."""
    return _CATEGORY.sub(r"\\p{L}", regex)


class RegexSplitter:
    """Splits text as llama.cpp's unicode_regex_split does for one list of regexes."""

    def __init__(self, regexes: list[str]):
        splits = [pre_tokenizers.Split(Regex(_collapse(r)), "isolated") for r in regexes]
        self.split = pre_tokenizers.Sequence(splits)
        # a literal class holding a non-ASCII space must not see it (llama.cpp made it \v);
        # only deepseek-llm's [　-。] does
        spaces = {c for c in _SPACES if any(_holds(r, c) for r in regexes)}
        self._spaces = re.compile("[" + "".join(sorted(spaces)) + "]") if spaces else None
        self._table = {ord(c): "\v" for c in spaces}

    def needs_stand_ins(self, text: str) -> bool:
        """Whether `text` must be split through a copy (see the module's docstring)."""
        if text.isascii():
            return False
        return has_undefined(text) or bool(self._spaces is not None and self._spaces.search(text))

    def words(self, text: str) -> list[str]:
        """The pieces of `text`, split through a copy where `needs_stand_ins`."""
        copy = replace_undefined(text, _STAND_IN).translate(self._table)
        pre = PreTokenizedString(copy)
        self.split.pre_tokenize(pre)
        return [text[a:b] for _, (a, b), _ in pre.get_splits()]


@cache
def _holds(regex: str, char: str) -> bool:
    """Whether a literal bracket class of `regex` matches `char` where it does not match \\v."""
    classes = re.findall(r"\[(?:\\.|[^\]\\])*\]", _collapse(regex))
    probe = pre_tokenizers.Split(Regex("|".join(classes)), "removed") if classes else None
    if probe is None:
        return False
    return probe.pre_tokenize_str(char) == [] and probe.pre_tokenize_str("\v") != []
