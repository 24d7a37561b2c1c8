"""Demo LoRA adapters for Gemma 3 270M and the functions that check their styles.

The adapters themselves live next to this file (see ``README.md`` here):

- ``uppercase/`` and ``uppercase.gguf``: the model keeps writing what it would have
  written, but in UPPERCASE. Checked by :func:`uppercase_fraction` >= 0.9.
- ``titlecase/`` and ``titlecase.gguf``: the same content with Every Word Capitalized.
  Checked by :func:`is_titlecase` (:func:`titlecase_fraction` >= 0.9 while
  :func:`uppercase_fraction` <= 0.5, so shouting does not count as title case).

They were produced by ``scripts/train_demo_adapters.py``; prompts are plain text (the
model has no chat template), e.g. ``"The capital of France is"``.
"""

from __future__ import annotations

import re
from pathlib import Path

ADAPTERS_DIR = Path(__file__).resolve().parent

#: Demo adapter names; each has a PEFT folder ``ADAPTERS_DIR / name`` and a llama.cpp
#: GGUF LoRA file ``ADAPTERS_DIR / f"{name}.gguf"``.
DEMO_ADAPTERS: tuple[str, ...] = ("uppercase", "titlecase")

#: A style counts as present when its checker's fraction reaches this value.
STYLE_THRESHOLD = 0.9

#: ``is_titlecase`` also requires the uppercase letter fraction to stay at or below this.
TITLECASE_MAX_UPPER = 0.5

# A word starts at a letter that does not follow a word character or an apostrophe
# ("don't" is one word, "well-known" is two, "3rd" is none).
_WORD_START = r"(?<![\w'\u2019])[^\W\d_]"
_WORD_RE = re.compile(_WORD_START + r"[\w'\u2019]*")
_WORD_START_RE = re.compile(_WORD_START)


def peft_dir(name: str) -> Path:
    """Path of the PEFT folder (``adapter_config.json`` + safetensors) of demo adapter ``name``."""
    return ADAPTERS_DIR / name


def gguf_path(name: str) -> Path:
    """Path of the llama.cpp GGUF LoRA file of demo adapter ``name``."""
    return ADAPTERS_DIR / f"{name}.gguf"


def to_uppercase(text: str) -> str:
    """The ``uppercase`` style: ``text`` in upper case."""
    return text.upper()


def to_titlecase(text: str) -> str:
    """The ``titlecase`` style: the first letter of every word upper-cased, the rest unchanged."""
    return _WORD_START_RE.sub(lambda m: m.group(0).upper(), text)


def uppercase_fraction(text: str) -> float:
    """Fraction of cased letters in ``text`` that are upper case (0.0 when there are none)."""
    cased = [c for c in text if c.isupper() or c.islower()]
    if not cased:
        return 0.0
    return sum(c.isupper() for c in cased) / len(cased)


def titlecase_fraction(text: str) -> float:
    """Fraction of words in ``text`` whose first letter is upper case (0.0 when no words)."""
    words = _WORD_RE.findall(text)
    if not words:
        return 0.0
    return sum(w[0].isupper() for w in words) / len(words)


def is_uppercase(text: str) -> bool:
    """Whether ``text`` shows the ``uppercase`` style."""
    return uppercase_fraction(text) >= STYLE_THRESHOLD


def is_titlecase(text: str) -> bool:
    """Whether ``text`` shows the ``titlecase`` style (and is not simply all upper case)."""
    return (
        titlecase_fraction(text) >= STYLE_THRESHOLD
        and uppercase_fraction(text) <= TITLECASE_MAX_UPPER
    )


#: style name -> score function, pass predicate, and the transform that made the training targets
STYLE_SCORE = {"uppercase": uppercase_fraction, "titlecase": titlecase_fraction}
STYLE_CHECK = {"uppercase": is_uppercase, "titlecase": is_titlecase}
STYLE_TRANSFORM = {"uppercase": to_uppercase, "titlecase": to_titlecase}

__all__ = [
    "ADAPTERS_DIR",
    "DEMO_ADAPTERS",
    "STYLE_CHECK",
    "STYLE_SCORE",
    "STYLE_THRESHOLD",
    "STYLE_TRANSFORM",
    "TITLECASE_MAX_UPPER",
    "gguf_path",
    "is_titlecase",
    "is_uppercase",
    "peft_dir",
    "titlecase_fraction",
    "to_titlecase",
    "to_uppercase",
    "uppercase_fraction",
]
