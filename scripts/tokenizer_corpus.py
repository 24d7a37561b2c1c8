"""The fixed and random strings the tokenizer oracle records (scripts/record_tokenizer_cases.py)."""

from __future__ import annotations

import random
import string

from tokenizer_vocabs import (
    EXTRA_FIXED,
    WORDS,
)

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
