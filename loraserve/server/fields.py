"""Parsers of the free-form request fields (prompts, stop strings, logit_bias, messages)
and their limits, shared by every request body in `schemas.py`.

Each parser accepts llama-server's forms and raises `ValueError` naming the offending
element (`[2]: expected a token id ...`); the handlers turn that into a 400.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator

from loraserve.chat.template import normalize_messages

INT32_MAX = 2**31 - 1
MAX_STOP = 16  # stop strings per request
MAX_STOP_LEN = 1024  # characters per stop string
MAX_LOGIT_BIAS = 1024  # logit_bias entries per request (token texts: after tokenizing)
MAX_BIAS_TEXT = 256  # characters of a logit_bias token text
MAX_PROMPTS = 1024  # prompts in one /completion request

Prompt = str | list[int | str]


def is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _err(where: str, msg: str) -> ValueError:
    return ValueError(f"{where}: {msg}" if where else msg)


def check_token(x: Any, where: str) -> int:
    if not is_token(x) or not 0 <= x <= INT32_MAX:
        raise _err(where, f"expected a token id (integer >= 0), got {x!r}")
    return x


def parse_mixed(p: Any, where: str) -> Prompt:
    """A string, or a non-empty list of token ids and strings (llama.cpp's mixed prompt)."""
    if isinstance(p, str):
        return p
    if isinstance(p, dict) and isinstance(p.get("prompt_string"), str):
        if p.get("multimodal_data"):
            raise _err(where, "multimodal_data is not supported (text-only server)")
        return p["prompt_string"]
    if not isinstance(p, list):
        raise _err(where, "expected a string or a list of token ids and strings")
    if not p:
        raise _err(where, "must not be empty")
    return [x if isinstance(x, str) else check_token(x, f"{where}[{i}]") for i, x in enumerate(p)]


def parse_stop(v: Any) -> list[str]:
    words = [v] if isinstance(v, str) else v
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ValueError("must be a string or a list of strings")
    words = [w for w in words if w]
    if len(words) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop strings, got {len(words)}")
    if any(len(w) > MAX_STOP_LEN for w in words):
        raise ValueError(f"each stop string must be at most {MAX_STOP_LEN} characters")
    return words


def parse_logit_bias(v: Any) -> list[tuple[int | str, float]]:
    """llama.cpp's two forms: [[id, bias], ...] and {"id": bias}; bias false bans (-inf).
    A token may be given by its text (a string, or a key that is not a number): the bias
    applies to every token the text tokenizes to (`generation.logit_bias`)."""
    if isinstance(v, dict):
        pairs = [(k, b, f"[{k!r}]") for k, b in v.items()]
    elif isinstance(v, list):
        if bad := [i for i, el in enumerate(v) if not isinstance(el, list) or len(el) != 2]:
            raise ValueError(f"[{bad[0]}]: expected a [token_id, bias] pair")
        pairs = [(el[0], el[1], f"[{i}]") for i, el in enumerate(v)]
    else:
        raise ValueError('expected [[token_id, bias], ...] or {"token_id": bias}')
    if len(pairs) > MAX_LOGIT_BIAS:
        raise ValueError(f"at most {MAX_LOGIT_BIAS} entries, got {len(pairs)}")
    out: list[tuple[int | str, float]] = []
    for tok, bias, where in pairs:
        if isinstance(v, dict) and re.fullmatch(r"-?[0-9]+", tok):  # strtol's whole key
            tok = int(tok)
        if isinstance(tok, str):
            if not tok:
                raise ValueError(f"{where}: the token text is empty")
            if len(tok) > MAX_BIAS_TEXT:
                raise ValueError(
                    f"{where[:40]}: a token text is at most {MAX_BIAS_TEXT} characters, "
                    f"got {len(tok)}"
                )
        else:
            check_token(tok, where)
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, int | float):
            raise ValueError(f"{where}: bias must be a number or false, got {bias!r}")
        elif not math.isfinite(bias):
            raise ValueError(f"{where}: bias must be finite (use false to ban a token)")
        out.append((tok, float(bias)))
    return out


def parse_prompts(v: Any, entry: Callable[[Any, str], Prompt] | None = None) -> list[Prompt]:
    """One prompt or a list of them (llama.cpp's rules); ``entry`` parses each one (default
    `parse_mixed`; the embedding endpoints also take OpenAI content parts)."""
    entry = entry or parse_mixed
    if isinstance(v, str | dict):
        return [entry(v, "")]
    if not isinstance(v, list):
        raise ValueError("expected a string, a list of token ids, or a list of prompts")
    if not v:
        raise ValueError("must not be empty")
    if any(is_token(x) for x in v):
        return [parse_mixed(v, "")]
    if len(v) > MAX_PROMPTS:
        raise ValueError(f"at most {MAX_PROMPTS} prompts, got {len(v)}")
    return [entry(p, f"[{i}]") for i, p in enumerate(v)]


def parse_messages(v: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        return normalize_messages(v)
    except ValueError as exc:
        raise ValueError(str(exc).removeprefix("messages")) from None


Messages = Annotated[list[dict[str, Any]], AfterValidator(parse_messages)]


def check_chat_tools(tools: list[dict[str, Any]] | None, choice: Any) -> None:
    """Chat completions' `tools` (OpenAI function tools) and `tool_choice` (none, auto,
    required, or `{"type": "function", "function": {"name": ...}}` naming one of them);
    ValueError naming the field otherwise."""
    for i, tool in enumerate(tools or []):
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, dict):
            raise ValueError(f'tools[{i}]: must be {{"type": "function", "function": {{...}}}}')
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}].function.name: must be a non-empty string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise ValueError(f"tools[{i}].function.parameters: must be a JSON schema object")
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise ValueError('tool_choice: must be {"type": "function", "function": {"name": ...}}')
        if name not in {t["function"]["name"] for t in tools or []}:
            raise ValueError(f"tool_choice: no function named {name!r} in tools")
    elif choice not in (None, "none", "auto", "required"):
        raise ValueError("tool_choice: must be none, auto, required or a function")
    elif choice == "required" and not tools:
        raise ValueError("tool_choice: required needs at least one tool in tools")
