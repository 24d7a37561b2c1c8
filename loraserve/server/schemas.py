"""Request bodies with llama-server's field names, aliases and defaults (api.md).

Types are strict (`"5"` is not an integer, `1` is not a boolean), unknown fields are ignored
and a `null` field means "the server default", as in llama-server. Values llama-server would
clamp silently are errors here, except a negative `top_k`, which llama.cpp documents as
"disabled" and which becomes 0. Every error names its field (see `errors.validation_message`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    RootModel,
    model_validator,
)

from loraserve.server.chat_template import normalize_messages

INT32_MAX = 2**31 - 1
SEED_MAX = 2**32 - 1  # llama.cpp's LLAMA_DEFAULT_SEED: like -1, a random seed
MAX_STOP = 16  # stop strings per request
MAX_STOP_LEN = 1024  # characters per stop string
MAX_LOGIT_BIAS = 1024  # logit_bias entries per request
N_PROBS_MAX = 100  # n_probs / logprobs / top_logprobs upper bound
MAX_PROMPTS = 1024  # prompts in one /completion request
MAX_LORA_SCALE = 1e4  # |scale| of an adapter: far beyond any use, far below overflow
DEFAULT_TOP_LOGPROBS = 20  # llama-server's n_probs for chat `logprobs: true` alone
SAMPLING_KEYS = (
    "temperature top_k top_p min_p repeat_penalty repeat_last_n presence_penalty"
    " frequency_penalty seed n_probs logit_bias ignore_eos post_sampling_probs"
).split()
# Known fields asking for what this server does not do: a 400 rather than silently ignored.
UNSUPPORTED = {
    "grammar": "constrained generation (grammar)",
    "json_schema": "constrained generation (json_schema)",
    "tools": "tool calling",
    "response_format": "response_format other than text",
    "echo": "echo",
    "best_of": "best_of",
    "suffix": "suffix",
}

Prompt = str | list[int | str]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class _Body(_Strict):
    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        if not isinstance(data, BaseModel):
            raise ValueError("request body must be a JSON object")
        return data


def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _err(where: str, msg: str) -> ValueError:
    return ValueError(f"{where}: {msg}" if where else msg)


def _check_token(x: Any, where: str) -> int:
    if not _is_token(x) or not 0 <= x <= INT32_MAX:
        raise _err(where, f"expected a token id (integer >= 0), got {x!r}")
    return x


def _mixed(p: Any, where: str) -> Prompt:
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
    return [x if isinstance(x, str) else _check_token(x, f"{where}[{i}]") for i, x in enumerate(p)]


def _stop(v: Any) -> list[str]:
    words = [v] if isinstance(v, str) else v
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ValueError("must be a string or a list of strings")
    words = [w for w in words if w]
    if len(words) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop strings, got {len(words)}")
    if any(len(w) > MAX_STOP_LEN for w in words):
        raise ValueError(f"each stop string must be at most {MAX_STOP_LEN} characters")
    return words


def _logit_bias(v: Any) -> list[tuple[int, float]]:
    """llama.cpp's two forms: [[id, bias], ...] and {"id": bias}; bias false bans (-inf)."""
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
    out: list[tuple[int, float]] = []
    for tok, bias, where in pairs:
        if isinstance(tok, str):
            if not (tok.isascii() and tok.isdigit()):
                raise ValueError(f"{where}: token text is not supported, use token ids")
            tok = int(tok)
        _check_token(tok, where)
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, int | float):
            raise ValueError(f"{where}: bias must be a number or false, got {bias!r}")
        elif not math.isfinite(bias):
            raise ValueError(f"{where}: bias must be finite (use false to ban a token)")
        out.append((tok, float(bias)))
    return out


def _prompts(v: Any) -> list[Prompt]:
    if isinstance(v, str | dict):
        return [_mixed(v, "")]
    if not isinstance(v, list):
        raise ValueError("expected a string, a list of token ids, or a list of prompts")
    if not v:
        raise ValueError("must not be empty")
    if any(_is_token(x) for x in v):
        return [_mixed(v, "")]
    if len(v) > MAX_PROMPTS:
        raise ValueError(f"at most {MAX_PROMPTS} prompts, got {len(v)}")
    return [_mixed(p, f"[{i}]") for i, p in enumerate(v)]


def _only_one(v: int) -> int:
    if v != 1:
        raise ValueError(f"only n=1 (one completion per request) is supported, got {v}")
    return v


def _messages(v: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        return normalize_messages(v)
    except ValueError as exc:
        raise ValueError(str(exc).removeprefix("messages")) from None


Messages = Annotated[list[dict[str, Any]], AfterValidator(_messages)]


class LoraScaleItem(_Strict):
    """One adapter of a `lora` list: its `id` (position in GET /lora-adapters) and scale
    (**ours:** at most `MAX_LORA_SCALE` in size; larger ones only overflow to inf/NaN)."""

    id: int = Field(ge=0, le=INT32_MAX)
    scale: float = Field(ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE)


def _check_unique_ids(items: list[LoraScaleItem]) -> list[LoraScaleItem]:
    seen: set[int] = set()
    for i, item in enumerate(items):
        if item.id in seen:
            raise ValueError(f"[{i}].id: adapter {item.id} is listed twice")
        seen.add(item.id)
    return items


class LoraScales(RootModel[list[LoraScaleItem]]):
    """The body of POST /lora-adapters: a JSON array of `{id, scale}`, ids unique."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _array(cls, data: Any) -> Any:
        if not isinstance(data, list):
            raise ValueError('request body must be a JSON array of {"id", "scale"} objects')
        return data

    @model_validator(mode="after")
    def _unique(self) -> Self:
        _check_unique_ids(self.root)
        return self


class _GenerationParams(_Body):
    """Fields every generation endpoint shares; defaults are llama-server's."""

    n_predict: int = Field(
        -1,
        ge=-1,
        le=INT32_MAX,
        validation_alias=AliasChoices("n_predict", "max_completion_tokens", "max_tokens"),
    )
    temperature: float = Field(0.8, ge=0)
    top_k: Annotated[int, AfterValidator(lambda v: max(v, 0))] = Field(40, le=INT32_MAX)
    top_p: float = Field(0.95, ge=0, le=1)
    min_p: float = Field(0.05, ge=0, le=1)
    repeat_penalty: float = Field(1.0, gt=0)
    repeat_last_n: int = Field(64, ge=0, le=INT32_MAX)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: Annotated[int, AfterValidator(lambda v: -1 if v == SEED_MAX else v)] = Field(
        -1, ge=-1, le=SEED_MAX
    )
    stop: Annotated[list[str], PlainValidator(_stop)] = Field(default_factory=list)
    stream: bool = False
    cache_prompt: bool = True
    id_slot: int = Field(-1, ge=-1, le=INT32_MAX)
    n_probs: int = Field(
        0, ge=0, le=N_PROBS_MAX, validation_alias=AliasChoices("n_probs", "logprobs")
    )
    ignore_eos: bool = False
    post_sampling_probs: bool = False
    logit_bias: Annotated[list[tuple[int, float]], PlainValidator(_logit_bias)] = Field(
        default_factory=list
    )
    return_tokens: bool = False
    lora: Annotated[list[LoraScaleItem], AfterValidator(_check_unique_ids)] | None = None
    n: Annotated[int, AfterValidator(_only_one)] = Field(
        1, validation_alias=AliasChoices("n", "n_cmpl")
    )

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        for key, what in UNSUPPORTED.items():
            v = data.get(key) if isinstance(data, dict) else None
            if v and v not in ("text", {"type": "text"}):
                raise ValueError(f"{key}: {what} is not supported")
        return data

    def with_defaults(self, defaults: dict[str, Any]) -> Self:
        """A copy whose fields the client left unset take the server's defaults
        (`ServerConfig.request_defaults()`: `-n`, `--temp`, `--seed`, `--no-cache-prompt`...)."""
        unset = {
            k: v
            for k, v in defaults.items()
            if k in type(self).model_fields and k not in self.model_fields_set
        }
        return self.model_copy(update=unset)

    def lora_scales(self) -> dict[int, float] | None:
        """The request's own adapter map (id -> scale), or None when `lora` is absent or
        empty: the request then runs under a snapshot of the global scales."""
        return {item.id: item.scale for item in self.lora} if self.lora else None

    def sampling_kwargs(self) -> dict[str, Any]:
        """The sampler's plain values; `logit_bias` is a tuple of (token id, bias) with
        `false` as -inf; `seed` -1 means random."""
        kwargs = {k: getattr(self, k) for k in SAMPLING_KEYS}
        kwargs["logit_bias"] = tuple(self.logit_bias)
        return kwargs


class CompletionRequest(_GenerationParams):
    """POST /completion. `prompt` is normalized to a list of prompts, each a string or a
    list mixing token ids and strings (llama.cpp's rules: a top-level list holding any
    integer is one prompt, any other list is a list of prompts)."""

    prompt: Annotated[list[Prompt], PlainValidator(_prompts)]


class StreamOptions(_Strict):
    """OpenAI `stream_options`."""

    include_usage: bool = False


class OAICompletionRequest(CompletionRequest):
    """POST /v1/completions: /completion's fields plus OpenAI's `model`, `logprobs` (an
    integer, alias of n_probs) and `stream_options`."""

    model: str | None = None
    stream_options: StreamOptions | None = None


class OAIChatRequest(_GenerationParams):
    """POST /v1/chat/completions. `messages` are checked and their list-of-parts contents
    flattened to text (see `chat_template.normalize_messages`); `logprobs: true` asks for
    `top_logprobs` (default 20) candidates per token; `model` may name a loaded adapter."""

    messages: Messages = Field(min_length=1)
    model: str | None = None
    n_probs: int = Field(0, ge=0, le=N_PROBS_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=N_PROBS_MAX)
    add_generation_prompt: bool = True
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _logprobs(self) -> Self:
        if self.logprobs and "n_probs" not in self.model_fields_set:
            n = DEFAULT_TOP_LOGPROBS if self.top_logprobs is None else self.top_logprobs
            self.n_probs = n
        elif not self.logprobs and self.top_logprobs is not None:
            raise ValueError("top_logprobs requires logprobs to be set to true")
        return self


class ApplyTemplateRequest(_Body):
    """POST /apply-template: render `messages` with the chat template, no generation."""

    messages: Messages
    add_generation_prompt: bool = True


class LoadAdapterRequest(_Body):
    """**Ours:** POST /lora-adapters/load. `path` must lie under a `--lora-dir` directory
    (checked by the server); `name` defaults to the file or folder name."""

    path: str = Field(min_length=1)
    scale: float = Field(1.0, ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE)
    name: str | None = Field(None, min_length=1)


class UnloadAdapterRequest(_Body):
    """**Ours:** POST /lora-adapters/unload."""

    id: int = Field(ge=0, le=INT32_MAX)


def _tokens(v: Any) -> list[int]:
    if not isinstance(v, list):
        raise ValueError("expected a list of token ids")
    return [_check_token(t, f"[{i}]") for i, t in enumerate(v)]


class TokenizeRequest(_Body):
    """POST /tokenize. `content` is a string or a mixed list of strings and token ids."""

    content: Annotated[Prompt, PlainValidator(lambda v: v if v == [] else _mixed(v, ""))] = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    """POST /detokenize."""

    tokens: Annotated[list[int], PlainValidator(_tokens)] = Field(default_factory=list)
