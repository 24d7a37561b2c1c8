"""Auth over every route the app has (read from the app, so a new endpoint is covered the day
it is added): each refuses a missing or wrong key with the contract's 401, and accepts a right
one (Bearer or X-Api-Key, from --api-key or --api-key-file); only /health and the model list
are public (and a path the app does not have is protected too). The mutating endpoints (scales,
load, unload, slot actions) change nothing when refused. Key parsing and comparison, alone."""

from __future__ import annotations

import pytest

from loraserve.server.app import create_app
from loraserve.server.auth import PUBLIC_PATHS, ApiKeyMiddleware, presented_key
from loraserve.server.config.args import parse_server_args
from tests.server_util import peft_folder, serve_in_thread

MSGS = [{"role": "user", "content": "hi"}]
BODIES = {
    "/completion": {"prompt": "a", "n_predict": 1},
    "/completions": {"prompt": "a", "n_predict": 1},
    "/v1/completions": {"prompt": "a", "max_tokens": 1},
    "/v1/chat/completions": {"messages": MSGS, "max_tokens": 1},
    "/chat/completions": {"messages": MSGS, "max_tokens": 1},
    "/slots/{id_slot}": {"filename": "auth-slot.bin"},
    "/lora-adapters": [],
    "/lora-adapters/load": {"path": "up", "scale": 0.0},
    "/lora-adapters/unload": {"id": 99},
    "/tokenize": {"content": "a"},
    "/detokenize": {"tokens": [1]},
    "/apply-template": {"messages": MSGS},
}
UNAUTHORIZED = {
    "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
}
WRONG = [
    {},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer wrong"},
    {"Authorization": "Bearer key-one-and-more"},
    {"Authorization": "Basic key-one"},
    {"Authorization": "key-one"},
    {"X-Api-Key": "key-on"},
    {"X-Api-Key": ""},
    {"Api-Key": "key-one"},
]
RIGHT = [{"Authorization": "Bearer key-one"}, {"authorization": "bearer key-two"}]
RIGHT += [{"X-Api-Key": "key-two"}, {"x-api-key": "key-one"}]


def _routes() -> list[tuple[str, str]]:
    """(method, path) of every route, those of included routers too (FastAPI keeps them
    in `original_router`), hidden ones included."""
    app = create_app(parse_server_args([]))  # routes only: nothing is loaded
    out, todo = [], list(app.routes)
    while todo:
        r = todo.pop()
        if (inner := getattr(r, "original_router", None)) is not None:
            todo += inner.routes
            continue
        methods = getattr(r, "methods", None) or set()
        out += [(m, r.path) for m in sorted(methods - {"HEAD"})]
    return sorted(set(out))


ROUTES = _routes()
PROTECTED = [(m, p) for m, p in ROUTES if p not in PUBLIC_PATHS]
PROTECTED.append(("GET", "/no-such-route"))  # a path the app does not have needs a key too
SLOT_ACTIONS = ["save", "restore", "erase"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("auth2")
    peft_folder(folder / "loras" / "up", 1)
    (folder / "keys.txt").write_text("# operators\nkey-two\n")
    args = ["--api-key", "key-one", "--api-key-file", str(folder / "keys.txt"), "--metrics"]
    args += ["--slot-save-path", str(folder), "--lora-dir", str(folder / "loras")]
    args += ["--reranking"]  # the embedding and rerank endpoints answer too
    with serve_in_thread(args) as s:
        yield s


def send(srv, method: str, path: str, headers: dict[str, str], action: str = "save"):
    url = path.replace("{id_slot}", "0")
    if path == "/slots/{id_slot}":
        url += f"?action={action}"
    return srv.client.request(method, url, json=BODIES.get(path), headers=headers)


def test_every_route_is_covered() -> None:
    paths = {p for _, p in ROUTES}
    assert {"/health", "/v1/models", "/completion", "/lora-adapters/load", "/metrics"} <= paths
    assert {p for _, p in PROTECTED} >= set(BODIES) - {"/health"}
    assert "/openapi.json" in {p for _, p in PROTECTED}  # the schema is not public either


@pytest.mark.parametrize("method,path", PROTECTED, ids=[f"{m} {p}" for m, p in PROTECTED])
def test_protected_route(srv, method: str, path: str) -> None:
    actions = SLOT_ACTIONS if path == "/slots/{id_slot}" else ["save"]
    for action in actions:
        for headers in WRONG:
            r = send(srv, method, path, headers, action)
            assert r.status_code == 401 and r.json() == UNAUTHORIZED, (headers, r.text)
        for headers in RIGHT:
            r = send(srv, method, path, headers, action)
            assert r.status_code not in (401, 403) and r.status_code < 500, (headers, r.text)


def test_refused_mutations_change_nothing(srv) -> None:
    key = {"X-Api-Key": "key-one"}
    before = srv.client.get("/lora-adapters", headers=key).json()
    for path, body in (
        ("/lora-adapters/load", {"path": "up", "scale": 1.0}),
        ("/lora-adapters", [{"id": 0, "scale": 1.0}] if before else []),
        ("/lora-adapters/unload", {"id": before[0]["id"] if before else 0}),
    ):
        r = srv.client.post(path, json=body, headers={"X-Api-Key": "nope"})
        assert r.status_code == 401
    assert srv.client.get("/lora-adapters", headers=key).json() == before


@pytest.mark.parametrize("path", sorted(PUBLIC_PATHS))
def test_public_routes_need_no_key(srv, path: str) -> None:
    assert srv.client.get(path).status_code == 200
    assert srv.client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 200


def test_key_parsing_and_compare() -> None:
    mw = ApiKeyMiddleware(lambda *a: None, ["k1", "k2"])  # type: ignore[arg-type]
    assert mw.valid(b"k1") and mw.valid(b"k2")
    assert not mw.valid(b"k") and not mw.valid(b"") and not mw.valid(None)
    assert presented_key([(b"authorization", b"bearer  k1 ")]) == b"k1"
    assert presented_key([(b"x-api-key", b"k2")]) == b"k2"
    assert presented_key([(b"authorization", b"Token k1")]) is None


@pytest.mark.parametrize(
    "argv",
    [["--api-key", ""], ["--api-key", "  "], ["--api-key", "k1,"], ["--api-key", "k1, ,k2"]],
)
def test_empty_api_key_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """An empty key would run the server open: the start fails (status 2) with one line."""
    with pytest.raises(SystemExit) as exc:
        parse_server_args(argv)
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--api-key" in line and "empty API key" in line


@pytest.mark.parametrize("text", ["", "   \n", "\n", "# a comment only\n\n"])
def test_keyless_api_key_file_refused(
    tmp_path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        parse_server_args(["--api-key-file", str(path)])
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--api-key-file" in line and "holds no key" in line and str(path) in line
    path.write_text("# comment\n\n k1 \n")
    assert parse_server_args(["--api-key-file", str(path)]).api_keys == ("k1",)
