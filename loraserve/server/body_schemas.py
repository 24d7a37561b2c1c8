"""The small request bodies (**ours**, split out of `schemas`, which re-exports them): the
strict base classes every body derives from, the adapter lists and loads (`lora`,
`/lora-adapters`), and the service bodies (`/apply-template`, `/tokenize`, `/detokenize`).
Same conventions as `schemas`: strict types, unknown fields ignored, a `null` field is the
default, every error names its field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, RootModel, model_validator

from loraserve.server.fields import (
    INT32_MAX,
    Messages,
    Prompt,
    check_chat_tools,
    check_token,
    parse_mixed,
)

MAX_LORA_SCALE = 1e4  # |scale| of an adapter: far beyond any use, far below overflow


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
