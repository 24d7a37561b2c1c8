"""Embeddings and reranking, as llama-server (`--embedding`, `--reranking`, `--pooling`).

`POST /embedding` (also `/embeddings`) answers llama-server's native list of
`{index, embedding: [[...]]}` (one vector per token with pooling `none`, else the pooled
one); `POST /v1/embeddings` the OpenAI list with `usage` (pooling `none` is refused there,
as llama-server does; a body with `content` instead of `input` gets the native answer).
Pooled vectors are normalised by `embd_normalize` (2, euclidean, by default); per-token
ones never are. `POST /rerank` (also `/reranking`, `/v1/rerank`, `/v1/reranking`) scores
each document against the query (Jina's `documents` answer `results` with
`relevance_score`; TEI's `texts` a bare list with `score`, `return_text`), best first,
cut to `top_n`.

Every prompt runs through `Engine.submit(pooling=...)`: batched with completions, under
the request's LoRA mix (`lora`, or `model` naming an adapter, else the global scales).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import Field, PlainValidator
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from loraserve.engine.embedding import Pooling, normalize
from loraserve.engine.sampling.params import SamplingParams
from loraserve.server.body import body_doc, read_body
from loraserve.server.errors import (
    JsonResponse,
    exceed_context_size,
    invalid_request,
    not_supported,
)
from loraserve.server.fields import Prompt, parse_mixed, parse_prompts
from loraserve.server.generation import (
    check_tokens,
    off_loop,
    prompt_chars,
    start_flight,
    tokenize_prompt,
)
from loraserve.server.output import collect
from loraserve.server.schemas import LoraScaleItem, _Body, _check_unique_ids
from loraserve.server.state import ServerState, get_state

router = APIRouter()
MAX_INPUTS = 1024  # prompts (or documents) in one request


def _text_parts(parts: Any, where: str) -> str:
    if not isinstance(parts, list) or not parts:
        raise ValueError(f"{where}.content: expected a non-empty list of content parts")
    texts = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(
                f"{where}.content[{i}]: only text parts are supported (text-only model), "
                f"got type {kind!r}"
            )
        texts.append(part["text"])
    return "".join(texts)


def _entry(p: Any, where: str) -> Prompt:
    if isinstance(p, dict) and "content" in p:
        return _text_parts(p["content"], where or "input")
    return parse_mixed(p, where)


def parse_inputs(v: Any) -> list[Prompt]:
    """llama-server's embedding inputs: a string, a token/mixed list, an object
    (`prompt_string` or OpenAI `content` parts), or a list of those."""
    return parse_prompts(v, _entry)


Inputs = Annotated[list[Prompt], PlainValidator(parse_inputs)]
Lora = Annotated[list[LoraScaleItem], PlainValidator(lambda v: _check_unique_ids(_lora(v)))]


def _lora(v: Any) -> list[LoraScaleItem]:
    if not isinstance(v, list):
        raise ValueError('expected a list of {"id", "scale"} objects')
    return [LoraScaleItem.model_validate(x) for x in v]


class _EmbeddingBody(_Body):
    model: str | None = None
    lora: Lora | None = None

    def lora_items(self) -> list[tuple[int, float]] | None:
        return [(x.id, x.scale) for x in self.lora] if self.lora else None


class EmbeddingRequest(_EmbeddingBody):
    """POST /embedding, /v1/embeddings: `input` (or `content`), `encoding_format`
    (`float` or `base64`), `embd_normalize` (-1 none, 0 max-abs int16, 2 euclidean, p > 2)."""

    input: Inputs | None = None
    content: Inputs | None = None
    encoding_format: Literal["float", "base64"] = "float"
    embd_normalize: int = Field(2, ge=-1, le=64)


class RerankRequest(_EmbeddingBody):
    """POST /rerank: `query` and `documents` (Jina) or `texts` (TEI), `top_n`, and with
    TEI `return_text`."""

    query: str
    documents: Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)] | None = None
    texts: Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)] | None = None
    top_n: int | None = Field(None, ge=0)
    return_text: bool = False


def _oai_list(
    state: ServerState, body: _EmbeddingBody, n_tokens: int, key: str, items: list[Any]
) -> dict[str, Any]:
    """The OpenAI-style list answer: model, usage (prompt tokens only) and the items."""
    return {
        "model": body.model or state.model_name,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        key: items,
    }


def server_pooling(state: ServerState) -> Pooling:
    """`--pooling`, else `rank` with `--reranking`, else the model's (GGUF metadata)."""
    cfg = state.cfg
    if cfg.pooling:
        return Pooling(cfg.pooling)
    if cfg.reranking:
        return Pooling.RANK
    meta = state.model.metadata if state.model is not None else {}
    arch = meta.get("general.architecture", "")
    return Pooling.from_gguf(meta.get(f"{arch}.pooling_type"))


async def _embed(
    state: ServerState,
    http: HttpRequest,
    prompts: list[list[int]],
    body: _EmbeddingBody,
    pooling: Pooling,
) -> list[tuple[Any, int]]:
    """Each prompt's pooled result (tensor) with its token count, computed by the engine."""
    engine = state.require()
    for i, ids in enumerate(prompts):
        if len(ids) >= engine.n_ctx_slot:
            raise exceed_context_size(
                len(ids),
                engine.n_ctx_slot,
                f"input ({len(ids)} tokens) is too large to process: a slot holds "
                f"{engine.n_ctx_slot} tokens, increase the context size",
            )
        check_tokens(state, ids, f"input[{i}]" if len(prompts) > 1 else "input")
    sub = engine.submit(
        prompts,
        SamplingParams(),
        max_tokens=0,
        lora=body.lora_items(),
        adapter_name=body.model,
        pooling=pooling,
    )
    outs = await collect(await start_flight(state, sub), http)
    return [(o.final.embedding, len(o.prompt)) for o in outs if o.final is not None]


async def _embeddings(request: HttpRequest, oai: bool) -> Response:
    state = get_state(request)
    engine = state.require()
    if not (state.cfg.embedding or state.cfg.reranking):
        raise not_supported("This server does not support embeddings. Start it with `--embeddings`")
    pooling = server_pooling(state)
    body = await read_body(request, EmbeddingRequest)
    inputs = body.input if body.input is not None else body.content
    if inputs is None:
        raise invalid_request('"input" or "content" must be provided')
    oai = oai and body.input is not None  # "content" is not OpenAI's field
    if oai and pooling is Pooling.NONE:
        raise invalid_request(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type"
        )
    size = sum(prompt_chars(p) for p in inputs)
    prompts = await off_loop(lambda: [tokenize_prompt(engine.tokenizer, p) for p in inputs], size)
    results = await _embed(state, request, prompts, body, pooling)
    vectors = [
        (v if pooling is Pooling.NONE else normalize(v, body.embd_normalize), n) for v, n in results
    ]
    if not oai:
        return JsonResponse(
            [{"index": i, "embedding": v.tolist()} for i, (v, _) in enumerate(vectors)]
        )
    data = []
    for i, (v, _) in enumerate(vectors):
        item: dict[str, Any] = {"index": i, "object": "embedding"}
        if body.encoding_format == "base64":
            item["embedding"] = base64.b64encode(v[0].float().numpy().tobytes()).decode()
            item["encoding_format"] = "base64"
        else:
            item["embedding"] = v[0].tolist()
        data.append(item)
    return JsonResponse(_oai_list(state, body, sum(n for _, n in vectors), "data", data))


@router.post("/embedding", openapi_extra=body_doc(EmbeddingRequest))
@router.post("/embeddings", openapi_extra=body_doc(EmbeddingRequest))
async def embedding(request: HttpRequest) -> Response:
    """llama-server's native embeddings (see the module docstring)."""
    return await _embeddings(request, oai=False)


@router.post("/v1/embeddings", openapi_extra=body_doc(EmbeddingRequest))
async def embeddings_oai(request: HttpRequest) -> Response:
    """OpenAI embeddings (see the module docstring)."""
    return await _embeddings(request, oai=True)


def rerank_prompts(state: ServerState, query: str, docs: list[str]) -> list[list[int]]:
    """llama.cpp's rerank inputs without a `rerank` template: BOS (if the vocabulary adds
    it), the query, EOS (if it adds it), SEP (likewise), the document, EOS. The query is
    tokenized once for all the documents."""
    tok = state.require().tokenizer
    q = tok.encode(query, add_special=False, parse_special=False)
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    eos = [tok.eos_id] if tok.add_eos and tok.eos_id is not None else []
    head = [*bos, *q, *eos]
    return [[*head, *tok.encode(d, add_special=False, parse_special=False), *eos] for d in docs]


@router.post("/rerank", openapi_extra=body_doc(RerankRequest))
@router.post("/reranking", openapi_extra=body_doc(RerankRequest))
@router.post("/v1/rerank", openapi_extra=body_doc(RerankRequest))
@router.post("/v1/reranking", openapi_extra=body_doc(RerankRequest))
async def rerank(request: HttpRequest) -> Response:
    """Score documents against a query (see the module docstring)."""
    state = get_state(request)
    state.require()
    if not state.cfg.reranking and not (state.cfg.embedding and state.cfg.pooling == "rank"):
        raise not_supported("This server does not support reranking. Start it with `--reranking`")
    body = await read_body(request, RerankRequest)
    tei = body.texts is not None
    docs = body.texts if tei else body.documents
    if not docs:
        raise invalid_request('"documents" must be a non-empty string array')
    size = len(body.query) + sum(map(len, docs))
    prompts = await off_loop(lambda: rerank_prompts(state, body.query, docs), size)
    results = await _embed(state, request, prompts, body, Pooling.RANK)
    label = "score" if tei else "relevance_score"
    items = []
    for i, (v, _) in enumerate(results):
        item: dict[str, Any] = {"index": i, label: float(v[0][0])}
        if tei and body.return_text:
            item["text"] = docs[i]
        items.append(item)
    items.sort(key=lambda x: x[label], reverse=True)
    items = items[: len(items) if body.top_n is None else body.top_n]
    if tei:
        return JsonResponse(items)
    return JsonResponse(_oai_list(state, body, sum(n for _, n in results), "results", items))
