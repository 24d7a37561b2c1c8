"""schemathesis against the server's own OpenAPI schema (bounded): for every operation,
bodies, paths and queries generated from the schema (valid ones, and invalid ones in
negative mode) never get a 5xx nor an error logged (a stream that broke after its 200); every
error has the contract's shape; still healthy after.
`LORASERVE_SCHEMA_SCALE=10` multiplies the number of examples for a deeper local run.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from loraserve.server.app import create_app
from loraserve.server.config.args import parse_server_args
from tests.server_util import peft_folder, serve_in_thread

SCALE = float(os.environ.get("LORASERVE_SCHEMA_SCALE", "1"))  # >1 for a deeper local run
EXAMPLES = {GenerationMode.POSITIVE: int(12 * SCALE), GenerationMode.NEGATIVE: int(8 * SCALE)}


def _operations() -> list[tuple[str, str, GenerationMode]]:
    """Every operation in positive mode, and in negative mode those with inputs."""
    spec = create_app(parse_server_args([])).openapi()  # routes only: nothing is loaded
    out = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            out.append((method.upper(), path, GenerationMode.POSITIVE))
            if op.get("parameters") or op.get("requestBody"):
                out.append((method.upper(), path, GenerationMode.NEGATIVE))
    return out


OPERATIONS = _operations()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    loras = tmp_path_factory.mktemp("st-loras")
    peft_folder(loras / "up", 1)
    slots = tmp_path_factory.mktemp("st-slots")
    args = ["-np", "2", "-c", "256", "-n", "8", "--metrics", "--lora", str(loras / "up")]
    args += ["--reranking"]  # the embedding and rerank endpoints too
    with serve_in_thread([*args, "--lora-dir", str(loras), "--slot-save-path", str(slots)]) as s:
        yield s


@pytest.fixture(scope="module")
def schema(srv) -> Any:
    spec = srv.client.get("/openapi.json").json()
    return schemathesis.openapi.from_dict(spec)


def test_schema_lists_every_endpoint() -> None:
    paths = {p for _, p, _ in OPERATIONS}
    assert {"/completion", "/v1/chat/completions", "/lora-adapters/load", "/slots/{id_slot}"} <= (
        paths
    )


@pytest.mark.parametrize(
    "method,path,mode", OPERATIONS, ids=[f"{m} {p} {g.value}" for m, p, g in OPERATIONS]
)
def test_no_server_error(srv, schema, method: str, path: str, mode: GenerationMode, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="loraserve")
    operation = schema[path][method]
    seen: list[int] = []

    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        r = case.call(base_url=srv.url, timeout=60)
        seen.append(r.status_code)
        assert r.status_code < 500, f"{case.as_curl_command()}\n-> {r.status_code} {r.text}"
        if r.status_code >= 400:
            err = r.json()["error"]
            assert err["code"] == r.status_code, r.text
            assert isinstance(err["message"], str) and err["message"], r.text
            assert isinstance(err["type"], str), r.text

    run()
    assert seen, "no example was generated"
    assert not [r for r in caplog.records if r.name.startswith("loraserve")], caplog.text
    assert srv.client.get("/health").json() == {"status": "ok"}
