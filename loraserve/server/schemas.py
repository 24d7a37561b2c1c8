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
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    RootModel,
    model_validator,
)

from loraserve.engine.sampling.params import SamplingParams
from loraserve.engine.spec.config import SpecRequest
from loraserve.server.fields import (
    INT32_MAX,
    Messages,
    Prompt,
    check_chat_tools,
    check_token,
    parse_logit_bias,
    parse_mixed,
    parse_prompts,
    parse_stop,
)

_SP = SamplingParams  # the sampling defaults
SEED_MAX = 2**32 - 1  # llama.cpp's LLAMA_DEFAULT_SEED: like -1, a random seed
N_PROBS_MAX = 100  # n_probs / logprobs / top_logprobs upper bound
MAX_LORA_SCALE = 1e4  # |scale| of an adapter: far beyond any use, far below overflow
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


class LoraScaleItem(_Strict):
    """One adapter of a `lora` list: its `id` (position in GET /lora-adapters) and scale
    (**ours:** at most `MAX_LORA_SCALE` in size; larger ones only overflow to inf/NaN)."""

    id: int = Field(ge=0, le=INT32_MAX)
    scale: float = Field(ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE)


class LoraUseItem(_Strict):
    """One adapter of a request's `lora` list: its `id`, or **ours** its `name` (an adapter
    loaded, or one under `--lora-dir`, read on first use), and its scale."""

    id: int | None = Field(None, ge=0, le=INT32_MAX)
    name: str | None = Field(None, min_length=1)
    scale: float = Field(ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE)

    @model_validator(mode="after")
    def _id_or_name(self) -> Self:
        if (self.id is None) == (self.name is None):
            raise ValueError('give the adapter\'s "id" or its "name" (one of them)')
        return self

    @property
    def ref(self) -> int | str:
        """The adapter's id, or its name."""
        return self.id if self.id is not None else str(self.name)


def _check_unique_refs(items: list[LoraUseItem]) -> list[LoraUseItem]:
    seen: set[int | str] = set()
    for i, item in enumerate(items):
        ref = item.ref.casefold() if isinstance(item.ref, str) else item.ref
        if ref in seen:
            field_name = "name" if isinstance(item.ref, str) else "id"
            raise ValueError(f"[{i}].{field_name}: adapter {item.ref!r} is listed twice")
        seen.add(ref)
    return items


def _check_unique_ids(items: list[LoraScaleItem]) -> list[LoraScaleItem]:
    seen: set[int] = set()
    for i, item in enumerate(items):
        if item.id in seen:
            raise ValueError(f"[{i}].id: adapter {item.id} is listed twice")
        seen.add(item.id)
    return items


class LoraScales(RootModel[list[LoraUseItem]]):
    """The body of POST /lora-adapters: a JSON array of `{id, scale}`, ids unique. **Ours:**
    an entry may give the adapter's `name` instead (one under `--lora-dir` included)."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _array(cls, data: Any) -> Any:
        if not isinstance(data, list):
            raise ValueError('request body must be a JSON array of {"id", "scale"} objects')
        return data

    @model_validator(mode="after")
    def _unique(self) -> Self:
        _check_unique_refs(self.root)
        return self


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


class ApplyTemplateRequest(_Body):
    """POST /apply-template: render `messages` with the chat template, no generation; as
    llama-server, the chat request's rendering fields count (`tools`, `reasoning_effort`)."""

    messages: Messages
    add_generation_prompt: bool = True
    continue_final_message: bool | Literal["content", "reasoning_content"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    reasoning_effort: str | None = None

    @model_validator(mode="after")
    def _tools(self) -> Self:
        check_chat_tools(self.tools, None)
        return self


class LoadAdapterRequest(_Body):
    """**Ours:** POST /lora-adapters/load. `path` must lie under a `--lora-dir` directory
    (checked by the server); `name` defaults to the file or folder name (suffixed `-2`,
    `-3`... when taken; a given `name` that is taken is refused). The new adapter's global
    `scale` is 0 unless given, so default requests keep their answers."""

    path: str = Field(min_length=1)
    scale: float = Field(0.0, ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE)
    name: str | None = Field(None, min_length=1)
    pinned: bool = False  # never evicted by --lora-max-loaded / --lora-max-memory


class UnloadAdapterRequest(_Body):
    """**Ours:** POST /lora-adapters/unload."""

    id: int = Field(ge=0, le=INT32_MAX)


def _tokens(v: Any) -> list[int]:
    if not isinstance(v, list):
        raise ValueError("expected a list of token ids")
    return [check_token(t, f"[{i}]") for i, t in enumerate(v)]


class TokenizeRequest(_Body):
    """POST /tokenize. `content` is a string or a mixed list of strings and token ids."""

    content: Annotated[Prompt, PlainValidator(lambda v: v if v == [] else parse_mixed(v, ""))] = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    """POST /detokenize."""

    tokens: Annotated[list[int], PlainValidator(_tokens)] = Field(default_factory=list)
