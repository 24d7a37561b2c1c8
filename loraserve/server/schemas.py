"""Request bodies with llama-server's field names, aliases and defaults (api.md).

Types are strict (`"5"` is not an integer, `1` is not a boolean), unknown fields are ignored
and a `null` field means "the server default", as in llama-server. Values llama-server would
clamp silently are errors here, except a negative `top_k`, which llama.cpp documents as
"disabled" and which becomes 0. Every error names its field (see `errors.validation_message`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    AliasChoices,
    Field,
    PlainValidator,
    PrivateAttr,
    model_validator,
)

from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecRequest
from loraserve.server.body_schemas import (
    MAX_LORA_SCALE,
    ApplyTemplateRequest,
    DetokenizeRequest,
    LoadAdapterRequest,
    LoraScaleItem,
    LoraScales,
    LoraUseItem,
    TokenizeRequest,
    UnloadAdapterRequest,
    _Body,
    _check_unique_ids,
    _check_unique_refs,
    _Strict,
)
from loraserve.server.fields import (
    INT32_MAX,
    Messages,
    Prompt,
    check_chat_tools,
    parse_logit_bias,
    parse_prompts,
    parse_stop,
)

__all__ = [  # the generation bodies, and the small ones re-exported from `body_schemas`
    "DEFAULT_TOP_LOGPROBS",
    "MAX_CACHE_SALT",
    "MAX_LORA_SCALE",
    "N_PROBS_MAX",
    "SAMPLING_KEYS",
    "SEED_MAX",
    "UNSUPPORTED",
    "ApplyTemplateRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "LoadAdapterRequest",
    "LoraScaleItem",
    "LoraScales",
    "LoraUseItem",
    "OAIChatRequest",
    "OAICompletionRequest",
    "Prompt",
    "StreamOptions",
    "TokenizeRequest",
    "UnloadAdapterRequest",
    "_Body",
    "_GenerationParams",
    "_Strict",
    "_check_unique_ids",
]
_SP = SamplingParams  # the sampling defaults
SEED_MAX = 2**32 - 1  # llama.cpp's LLAMA_DEFAULT_SEED: like -1, a random seed
N_PROBS_MAX = 100  # n_probs / logprobs / top_logprobs upper bound
DEFAULT_TOP_LOGPROBS = 20  # llama-server's n_probs for chat `logprobs: true` alone
SAMPLING_KEYS = (
    "temperature top_k top_p min_p repeat_penalty repeat_last_n presence_penalty"
    " frequency_penalty seed n_probs logit_bias ignore_eos post_sampling_probs"
).split()
# Known fields asking for what this server does not do: a 400 rather than silently ignored.
UNSUPPORTED = {
    "tools": "tool calling",
    "echo": "echo",
    "best_of": "best_of",
    "suffix": "suffix",
}


def _schema(v: Any) -> Any:
    if not isinstance(v, dict | bool):
        raise ValueError("must be a JSON schema (an object, or true/false)")
    return v


MAX_CACHE_SALT = 1024  # characters of a `cache_salt`


class _GenerationParams(_Body):
    """Fields every generation endpoint shares; defaults are llama-server's."""

    n_predict: int = Field(
        -1,
        ge=-1,
        le=INT32_MAX,
        validation_alias=AliasChoices("n_predict", "max_completion_tokens", "max_tokens"),
    )
    temperature: float = Field(_SP.temperature, ge=0)
    top_k: Annotated[int, AfterValidator(lambda v: max(v, 0))] = Field(_SP.top_k, le=INT32_MAX)
    top_p: float = Field(_SP.top_p, ge=0, le=1)
    min_p: float = Field(_SP.min_p, ge=0, le=1)
    repeat_penalty: float = Field(_SP.repeat_penalty, gt=0)
    repeat_last_n: int = Field(_SP.repeat_last_n, ge=0, le=INT32_MAX)
    presence_penalty: float = _SP.presence_penalty
    frequency_penalty: float = _SP.frequency_penalty
    seed: Annotated[int, AfterValidator(lambda v: -1 if v == SEED_MAX else v)] = Field(
        _SP.seed, ge=-1, le=SEED_MAX
    )
    stop: Annotated[list[str], PlainValidator(parse_stop)] = Field(default_factory=list)
    stream: bool = False
    cache_prompt: bool = True
    id_slot: int = Field(-1, ge=-1, le=INT32_MAX)
    n_probs: int = Field(
        0, ge=0, le=N_PROBS_MAX, validation_alias=AliasChoices("n_probs", "logprobs")
    )
    ignore_eos: bool = _SP.ignore_eos
    post_sampling_probs: bool = _SP.post_sampling_probs
    logit_bias: Annotated[list[tuple[int | str, float]], PlainValidator(parse_logit_bias)] = Field(
        default_factory=list
    )
    return_tokens: bool = False
    # constrained generation (`server/grammar.py`): GBNF, a JSON schema, OpenAI's format
    grammar: str | None = None
    json_schema: Annotated[Any, PlainValidator(_schema)] = None
    response_format: dict[str, Any] | None = None
    verbose: bool = False  # `__verbose` in OpenAI answers (as `-v` does for all)
    return_progress: bool = False  # streams: `prompt_progress` while the prompt runs
    timings_per_token: bool = False  # streams: `timings` with every token
    lora: Annotated[list[LoraUseItem], AfterValidator(_check_unique_refs)] | None = None
    n: int = Field(1, ge=1, le=INT32_MAX, validation_alias=AliasChoices("n", "n_cmpl"))
    # the request's tenant in the prefix cache (vLLM's): KV is reused only from requests
    # with the same salt, so no other tenant's prompt can be probed through `tokens_cached`
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT)
    # `logit_bias` by token id, once resolved (`generation.logit_bias`: tokenized once)
    _bias_ids: list[tuple[int, float]] | None = PrivateAttr(None)
    # speculative decoding (`server/config/spec_flags.py`), llama-server's dotted names
    spec_n_max: int | None = Field(None, ge=0, le=INT32_MAX, validation_alias="speculative.n_max")
    spec_n_min: int | None = Field(None, ge=0, le=INT32_MAX, validation_alias="speculative.n_min")
    spec_p_min: float | None = Field(None, ge=0, le=1, validation_alias="speculative.p_min")

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        for key, what in UNSUPPORTED.items():
            if key in cls.model_fields:  # a body that declares it checks it itself
                continue
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

    def lora_scales(self) -> dict[int | str, float] | None:
        """The request's own adapter map (id or name -> scale), or None when `lora` is
        absent or empty: the request then runs under a snapshot of the global scales."""
        return {item.ref: item.scale for item in self.lora} if self.lora else None

    def speculative(self) -> SpecRequest | None:
        """The request's `speculative.n_max/n_min/p_min` (None: the server's settings)."""
        values = (self.spec_n_max, self.spec_n_min, self.spec_p_min)
        return None if values == (None, None, None) else SpecRequest(*values)

    def sampling_kwargs(self) -> dict[str, Any]:
        """The sampler's plain values; `logit_bias` is a tuple of (token id, bias) with
        `false` as -inf; `seed` -1 means random."""
        kwargs = {k: getattr(self, k) for k in SAMPLING_KEYS}
        kwargs["logit_bias"] = tuple(self.logit_bias)
        return kwargs


class CompletionRequest(_GenerationParams):
    """POST /completion. `prompt` is normalized to a list of prompts, each a string or a
    list mixing token ids and strings (llama.cpp's rules: a top-level list holding any
    integer is one prompt, any other list is a list of prompts). `response_fields` keeps
    only those fields of the answer (`a/b` names a nested one, kept under that name)."""

    prompt: Annotated[list[Prompt], PlainValidator(parse_prompts)]
    response_fields: list[str] = Field(default_factory=list, max_length=256)


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
    flattened to text (see `chat_template.normalize_messages`); `chat_template_kwargs` are
    extra variables for a Jinja template (over `--chat-template-kwargs`); `logprobs: true` asks for
    `top_logprobs` (default 20) candidates per token; `model` may name a loaded adapter."""

    messages: Messages = Field(min_length=1)
    model: str | None = None
    n_probs: int = Field(0, ge=0, le=N_PROBS_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=N_PROBS_MAX)
    add_generation_prompt: bool = True
    # None: continue a last assistant message; "content" / "reasoning_content": continue
    # that part (llama-server's `common_chat_continuation_parse`)
    continue_final_message: bool | Literal["content", "reasoning_content"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    stream_options: StreamOptions | None = None
    # OpenAI function tools, parsed in the template's format (`server/tool_calls.py`)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    # where reasoning goes (over --reasoning-format); "none" effort turns thinking off
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = None
    reasoning_effort: str | None = None
    reasoning_budget_tokens: int | None = Field(None, ge=-1)
    thinking_budget_tokens: int | None = Field(None, ge=-1)  # llama-server's other spelling
    reasoning_budget_message: str | None = None  # before the forced end (over the flag's)

    @model_validator(mode="after")
    def _tools(self) -> Self:
        check_chat_tools(self.tools, self.tool_choice)
        return self

    @model_validator(mode="after")
    def _logprobs(self) -> Self:
        if self.logprobs and "n_probs" not in self.model_fields_set:
            n = DEFAULT_TOP_LOGPROBS if self.top_logprobs is None else self.top_logprobs
            self.n_probs = n
        elif not self.logprobs and self.top_logprobs is not None:
            raise ValueError("top_logprobs requires logprobs to be set to true")
        return self
