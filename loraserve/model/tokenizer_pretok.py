"""llama.cpp's BPE pre-tokenizers: the regexes of each `tokenizer.ggml.pre`, run by `tokenizers`.

llama.cpp (llm_tokenizer_bpe, unicode_regex_split) splits a text fragment with a list of
regexes, each splitting the pieces of the one before and keeping both the matches and the text
between them. A regex that names a Unicode category runs on a "collapsed" text where each
non-ASCII code point stands for its category (so `\\p{Lu}` means any letter, and a code point its
tables do not know is "other"); the others run on the code points with non-ASCII spaces made
`\\v`. `tokenizers`' `Split(regex, "isolated")` does the same splitting with the regexes below
(llama.cpp's adapted forms, `\\p{Lu}` and the like widened to `\\p{L}` as its collapse does).
Where the text holds a code point llama.cpp gives no category, or (for a regex with a literal
class holding one) a non-ASCII space, the split runs on a copy with that code point replaced by
one that both sides see the same way, and the pieces are cut from the real text.
"""

from __future__ import annotations

from dataclasses import dataclass

_C = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"  # contractions, any case
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _C + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_JAIS2 = (
    _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
    r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0"
    "-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-"
    "\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b"
    "\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-"
    "\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113"
    "\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00"
    "-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-"
    "\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-"
    "\U000118df\U0001e900-\U0001e943]+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_PUNCT_WORD = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"""
_DEEPSEEK3 = (
    _PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_UPPER = r"((?=[\p{L}])([^a-z]))"  # llama.cpp's stand-in for [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
_LOWER = r"((?=[\p{L}])([^A-Z]))"  # and for [\p{Ll}\p{Lm}\p{Lo}\p{M}]
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_C}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_C}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CASED = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"  # widened to [\p{L}\p{M}] by tokenizer_regex
_LOWERCASED = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]

# llama.cpp's LLAMA_VOCAB_PRE_TYPE_* -> its regexes
_REGEXES: dict[str, list[str]] = {
    "DEFAULT": _DEFAULT,
    "LLAMA3": [_LLAMA3],
    "DBRX": [_LLAMA3],
    "SMAUG": [_LLAMA3],
    "CHATGLM4": [_LLAMA3],
    "JAIS2": [_JAIS2],
    "DEEPSEEK_LLM": [
        "[\r\n]",
        _DEEPSEEK_LETTERS,
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ],
    "DEEPSEEK_CODER": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"],
    "DEEPSEEK3_LLM": [r"\p{N}{1,3}", _KANA, _DEEPSEEK3],
    "SPARK2_5": [
        r"\p{N}{1,3}",
        _KANA,
        _PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
        r"\p{N}",
    ],
    "YOUTU": [
        "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWERCASED}+{_C}?|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+"
        rf"{_LOWERCASED}*{_C}?|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    "FALCON": [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"],
    "STARCODER": [r"\p{N}", _GPT2],
    "GPT2": [_GPT2],
    "QWEN2": [_QWEN2],
    "QWEN35": [_QWEN35],
    "PORO": [_PORO],
    "VIKING": [_PORO, r"\p{N}"],
    "TEKKEN": [_TEKKEN],
    "CHAMELEON": [
        r"<sentinel:[0-9]+>",
        r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        r"([\t\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        _GPT2,
    ],
    "GPT4O": [_GPT4O],
    "GRANITE_EMB_MULTI": [_GPT4O.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")],
    "BAILINGMOE": [
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
    ],
    "SEED_CODER": [
        _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "UFAKZEKA": [_QWEN2[len(_C) + 1 :]],
    "LAGUNA": [r"[^\n]+|[\n]+", _QWEN2],
    "EXAONE_MOE": [
        _C + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+"
        r"[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"
    ],
    "MINICPM5": [
        r"\p{N}{1,3}",
        _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
}
# the custom splitters (tokenizer_pretok_custom.CUSTOM_STEPS) go by these exact strings
_REGEXES["KIMI_K2"] = [r"\p{Han}+"]
_REGEXES["AFMOE"] = [
    r"\p{AFMoE_digits}",
    "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f"
    "\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f"
    "\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",  # llama.cpp's text has U+8C48 where U+F900
    _DEEPSEEK3,
]
_REGEXES["TINY_AYA"] = [
    r"\d{1,3}(?=(?:\d{3})*\b)",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWERCASED}+{_C}?|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+"
    rf"{_LOWERCASED}*{_C}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
_REGEXES["SUPERBPE"] = [r"\p{N}+", r"(?=(\d{3})+(?!\d))"]
for _kind in ("REFACT", "COMMAND_R", "SMOLLM", "CODESHELL", "EXAONE", "MINERVA", "MELLUM2"):
    _REGEXES[_kind] = _REGEXES["STARCODER"]
for _kind in ("MPT", "OLMO", "JAIS", "TRILLION", "GRANITE_DOCLING"):
    _REGEXES[_kind] = _REGEXES["GPT2"]
for _kind in ("STABLELM2", "HUNYUAN", "SOLAR_OPEN", "GROK_2"):
    _REGEXES[_kind] = _REGEXES["QWEN2"]
for _kind in ("HUNYUAN_DENSE", "JOYAI_LLM", "HY_V4"):
    _REGEXES[_kind] = _REGEXES["DEEPSEEK3_LLM"]
_REGEXES["BLOOM"] = _REGEXES["GPT3_FINNISH"] = _REGEXES["PORO"]
_REGEXES["MINIMAX_M2"] = _REGEXES["GPT4O"]


@dataclass(frozen=True)
class PreType:
    """What llama_vocab::impl::load sets for one `tokenizer.ggml.pre` value."""

    kind: str  # LLAMA_VOCAB_PRE_TYPE_<kind>
    ignore_merges: bool = False  # a word that is a token is taken whole
    add_bos: bool = False  # default of tokenizer.ggml.add_bos_token
    no_bos: bool = False  # the default BOS id is none (tokenizer.ggml.bos_token_id still counts)

    @property
    def regexes(self) -> list[str]:
        return _REGEXES[self.kind]


def _names(kind: str, names: str, **flags: bool) -> dict[str, PreType]:
    return {name: PreType(kind, **flags) for name in names.split()}


# tokenizer.ggml.pre -> PreType, as llama_vocab::impl::load maps them (byte-level BPE only; the
# SentencePiece-style gemma4 / sarvam-moe are tokenizer_bpe_spm's, whitespace is not supported)
PRE_TYPES: dict[str, PreType] = {
    **_names("DEFAULT", "default"),
    **_names("MINICPM5", "minicpm5", ignore_merges=True),
    **_names(
        "LLAMA3",
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        ignore_merges=True,
        add_bos=True,
    ),
    **_names("DEEPSEEK_LLM", "deepseek-llm"),
    **_names("DEEPSEEK_CODER", "deepseek-coder"),
    **_names("DEEPSEEK3_LLM", "deepseek-v3"),
    **_names("SPARK2_5", "spark2_5"),
    **_names("YOUTU", "youtu", ignore_merges=True),
    **_names("FALCON", "falcon"),
    **_names("MPT", "mpt"),
    **_names("STARCODER", "starcoder"),
    **_names(
        "GPT2",
        "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
        "exaone4 jina-v1-en jina-v2-code roberta-bpe",
    ),
    **_names("JAIS2", "jais-2"),
    **_names("REFACT", "refact"),
    **_names("COMMAND_R", "command-r"),
    **_names("QWEN2", "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez"),
    **_names("QWEN35", "qwen35"),
    **_names("STABLELM2", "stablelm2"),
    **_names("OLMO", "olmo"),
    **_names("DBRX", "dbrx"),
    **_names("SMAUG", "smaug-bpe"),
    **_names("PORO", "poro-chat"),
    **_names("CHATGLM4", "chatglm-bpe", no_bos=True),
    **_names("CHATGLM4", "glm4 glm5", no_bos=True, ignore_merges=True),
    **_names("VIKING", "viking"),
    **_names("JAIS", "jais"),
    **_names("TEKKEN", "tekken", ignore_merges=True, add_bos=True),
    **_names("SMOLLM", "smollm"),
    **_names("CODESHELL", "codeshell"),
    **_names("BLOOM", "bloom"),
    **_names("GPT3_FINNISH", "gpt3-finnish"),
    **_names("EXAONE", "exaone"),
    **_names("EXAONE_MOE", "exaone-moe"),
    **_names("CHAMELEON", "chameleon", add_bos=True),
    **_names("MINERVA", "minerva-7b"),
    **_names("GPT4O", "gpt-4o llama4 kanana2 talkie"),
    **_names("GRANITE_EMB_MULTI", "granite-embed-multi-97m", ignore_merges=True),
    **_names("TRILLION", "trillion"),
    **_names("GRANITE_DOCLING", "granite-docling"),
    **_names("BAILINGMOE", "bailingmoe bailingmoe2 llada-moe"),
    **_names("SEED_CODER", "seed-coder"),
    **_names("HUNYUAN", "hunyuan"),
    **_names("HUNYUAN_DENSE", "hunyuan-dense"),
    **_names("HY_V4", "hy_v4"),
    **_names("JOYAI_LLM", "joyai-llm"),
    **_names("UFAKZEKA", "ufakzeka"),
    **_names("GROK_2", "grok-2"),
    **_names("LAGUNA", "laguna"),
    **_names("MINIMAX_M2", "minimax-m2"),
    **_names("SOLAR_OPEN", "solar-open"),
    **_names("MELLUM2", "mellum2"),
    **_names("KIMI_K2", "kimi-k2"),
    **_names("AFMOE", "afmoe"),
    **_names("TINY_AYA", "tiny_aya cohere2moe"),
    **_names("SUPERBPE", "superbpe"),
}
