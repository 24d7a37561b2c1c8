"""Constrained generation fields, as llama-server reads them: `grammar` (GBNF),
`json_schema` (a JSON schema), and OpenAI's `response_format` (`text`, `json_object` with
an optional `schema`, or `json_schema` with `json_schema.schema`).

`request_grammar` turns them into llguidance's grammar text through the engine
(`Engine.compile_grammar`, see `engine/constraint.py` for the library and its cost), or a
400 naming the field and the problem. No field: None (unconstrained). `AnswerConstraint`
is what a planned chat answer hands `generation.submit` instead: the grammar it settled on
and the reasoning budget, which the engine gets as the request's own fields.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from loraserve.engine.budget import BudgetSpec
from loraserve.engine.constraint import GrammarSpec
from loraserve.server.errors import invalid_request
from loraserve.server.state import ServerState

MAX_GRAMMAR_CHARS = 1 << 20  # GBNF text or a schema's JSON


@dataclass(frozen=True)
class AnswerConstraint:
    """What constrains one answer in the engine: llguidance's grammar text (None: none, the
    request's own fields included) and the reasoning budget (None: none)."""

    grammar: str | None
    budget: BudgetSpec | None = None


def _schema_of(response_format: dict[str, Any]) -> Any:
    """The JSON schema a `response_format` asks for (None: plain text)."""
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return response_format.get("schema", {"type": "object"})
    if kind == "json_schema":
        inner = response_format.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise invalid_request('response_format: "json_schema" needs {"schema": {...}}')
        return inner["schema"]
    raise invalid_request(
        f"response_format: type must be text, json_object or json_schema, got {kind!r}"
    )


def grammar_spec(
    grammar: str | None, json_schema: Any, response_format: dict[str, Any] | None
) -> tuple[str, GrammarSpec] | None:
    """The field that constrains the request and what it asks for (None: nothing)."""
    if response_format is not None:
        schema = _schema_of(response_format)
        if schema is not None:
            if json_schema is not None or grammar is not None:
                raise invalid_request(
                    "response_format: cannot be combined with json_schema or grammar"
                )
            json_schema = schema
            field = "response_format"
        else:
            field = "json_schema"
    else:
        field = "json_schema"
    if json_schema is not None and grammar is not None:
        raise invalid_request('Either "json_schema" or "grammar" can be specified, but not both')
    if json_schema is not None:
        if not isinstance(json_schema, dict | bool):
            raise invalid_request(f"{field}: a JSON schema must be an object")
        text = json.dumps(json_schema)
        if len(text) > MAX_GRAMMAR_CHARS:
            raise invalid_request(f"{field}: the schema is longer than {MAX_GRAMMAR_CHARS} chars")
        return field, GrammarSpec("json_schema", text)
    if grammar:
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise invalid_request(f"grammar: longer than {MAX_GRAMMAR_CHARS} characters")
        return "grammar", GrammarSpec("gbnf", grammar)
    return None


async def request_grammar(
    state: ServerState,
    grammar: str | None,
    json_schema: Any,
    response_format: dict[str, Any] | None,
) -> str | None:
    """llguidance's grammar text for a request's constraint fields (None: none), compiled
    off the event loop; a 400 naming the field when it is invalid."""
    found = grammar_spec(grammar, json_schema, response_format)
    if found is None:
        return None
    field, spec = found
    engine = state.require()
    try:
        return await asyncio.to_thread(engine.compile_grammar, spec)
    except ValueError as e:
        raise invalid_request(f"{field}: {e}") from None
