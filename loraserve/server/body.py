"""Request bodies: read and validated into a schema (`read_body`), and documented in the
OpenAPI schema (`body_doc`) while the handlers validate them themselves."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest

from loraserve.server.errors import invalid_request, parse_body

M = TypeVar("M", bound=BaseModel)
BIG_BODY_BYTES = 1 << 16  # larger bodies are parsed off the event loop


def body_doc(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """`openapi_extra` documenting a JSON request body of `model` (references inlined).

    Handlers still read and validate the body themselves (`errors.parse_body`), so that
    every bad body gets the contract's error answer.
    """
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(x: Any) -> Any:
        if isinstance(x, dict):
            if "$ref" in x:
                return inline(defs[x["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in x.items()}
        if isinstance(x, list):
            return [inline(v) for v in x]
        return x

    content = {"application/json": {"schema": inline(schema)}}
    return {"requestBody": {"required": required, "content": content}}


async def read_body(request: HttpRequest, model: type[M]) -> M:
    """The request body validated into `model` (`errors.parse_body`); a body nested too
    deeply for the JSON parser is a 400 too, and so is a client leaving mid-body."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise invalid_request("the client closed the connection before sending the body") from None

    def parse() -> M:
        try:
            return parse_body(model, raw)
        except RecursionError:
            raise invalid_request("Invalid JSON in request body: nested too deeply") from None

    if len(raw) > BIG_BODY_BYTES:  # parsing a large body would stall the event loop
        return await asyncio.to_thread(parse)
    return parse()
