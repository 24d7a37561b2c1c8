"""The built-in tools over HTTP (`--tools`, `POST /tools`): confined to `--tools-root`
(`..`, absolute paths and symlinks out refused, for reading, writing, listing and
searching), the shell tool only when named, llama-server's answers checked against the
files on disk and against llama.cpp's own test expectations (tools/server/tests/unit/
test_tools_builtin.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.server_util import serve_in_thread

SECRET = "top-secret-outside-the-root"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(root, outside): the tools root with a project in it, and a directory next to it
    that holds a secret, reachable from the root by `..`, by absolute path and by links."""
    base = tmp_path_factory.mktemp("tools")
    root, outside = base / "root", base / "outside"
    (root / "src" / "deep").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (root / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (root / "src" / "main.c").write_text("int main() { return 0; }\n")
    (root / "src" / "deep" / "x.c").write_text("// deep\n")
    (root / "node_modules" / "pkg").mkdir(parents=True)
    (root / "node_modules" / "pkg" / "index.js").write_text("gamma\n")
    (root / "link_out.txt").symlink_to(outside / "secret.txt")
    (root / "dir_out").symlink_to(outside)
    (root / "link_in.txt").symlink_to(root / "notes.txt")
    return root, outside


@pytest.fixture(scope="module")
def srv(dirs):
    root, _ = dirs
    with serve_in_thread(["--tools", "all", "--tools-root", str(root), "-np", "1"]) as s:
        yield s


def call(srv, tool: str, params: dict, headers: dict | None = None) -> dict:
    r = srv.client.post("/tools", json={"tool": tool, "params": params}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def refused(out: dict) -> bool:
    return "outside the tools root" in out.get("error", "")


def test_tool_list_is_llama_servers(srv) -> None:
    tools = srv.client.get("/tools").json()
    assert [t["tool"] for t in tools] == [
        "read_file", "file_glob_search", "grep_search", "exec_shell_command",
        "write_file", "edit_file", "get_info",
    ]  # fmt: skip
    for t in tools:
        assert t["type"] == "server" and t["definition"]["function"]["name"] == t["tool"]
        assert t["definition"]["type"] == "function"
        assert t["definition"]["function"]["parameters"]["type"] == "object"
    writes = {t["tool"] for t in tools if t["permissions"]["write"]}
    assert writes == {"exec_shell_command", "write_file", "edit_file"}


@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file", "grep_search"])
def test_paths_out_of_the_root_are_refused(srv, dirs, tool: str) -> None:
    root, outside = dirs
    spellings = [
        "../outside/secret.txt",
        "src/../../outside/secret.txt",
        str(outside / "secret.txt"),
        "link_out.txt",
        "dir_out/secret.txt",
        "~/" if not str(Path.home()).startswith(str(root)) else "/",
    ]
    extra = {
        "write_file": {"content": "pwned"},
        "edit_file": {"edits": [{"old_text": SECRET, "new_text": "pwned"}]},
        "grep_search": {"pattern": "secret"},
    }.get(tool, {})
    for path in spellings:
        out = call(srv, tool, {"path": path, **extra})
        assert refused(out), (path, out)
    assert (outside / "secret.txt").read_text() == SECRET + "\n"


def test_listing_and_search_never_leave_the_root(srv, dirs) -> None:
    root, _ = dirs
    out = call(srv, "file_glob_search", {"path": ".", "type": "all"})
    paths = {e["path"] for e in out["entries"]}
    assert {"notes.txt", "src/main.c", "src/deep/x.c", "link_in.txt", "node_modules"} <= paths
    assert not {"link_out.txt", "dir_out", "dir_out/secret.txt"} & paths
    assert not any(p.startswith("node_modules/") for p in paths)  # junk: listed, not walked
    assert out["base"] == str(root)
    grep = call(srv, "grep_search", {"path": ".", "pattern": "secret|gamma"})
    assert SECRET not in grep["plain_text_response"]
    lines = grep["plain_text_response"].split("\n---\n")[0].splitlines()
    assert sorted(lines) == ["link_in.txt:gamma", "notes.txt:gamma"]
    assert refused(call(srv, "file_glob_search", {"path": ".."}))


def test_inside_paths_work_however_spelled(srv, dirs) -> None:
    root, _ = dirs
    for path in ("notes.txt", str(root / "notes.txt"), "src/../notes.txt", "link_in.txt"):
        out = call(srv, "read_file", {"path": path})
        assert out == {"plain_text_response": "alpha\nbeta\ngamma\n"}, path
    out = call(srv, "read_file", {"path": "notes.txt", "start_line": 2, "append_loc": True})
    assert out["plain_text_response"] == "2\u2192beta\n3\u2192gamma\n"
    # the working directory header is confined too, and relative paths follow it
    out = call(srv, "read_file", {"path": "main.c"}, headers={"x-tool-cwd": "src"})
    assert out["plain_text_response"] == (root / "src" / "main.c").read_text()
    r = srv.client.post(
        "/tools",
        json={"tool": "read_file", "params": {"path": "secret.txt"}},
        headers={"x-tool-cwd": "../outside"},
    )
    assert r.status_code == 400 and "x-tool-cwd" in r.json()["error"]["message"]


def test_write_edit_read_roundtrip(srv, dirs) -> None:
    root, _ = dirs
    out = call(srv, "write_file", {"path": "out/log.txt", "content": "line1\nline2\nline3\n"})
    assert out["result"] == "file written successfully"
    target = root / "out" / "log.txt"
    assert target.read_text() == "line1\nline2\nline3\n"
    edits = [
        {"old_text": "line2", "new_text": "line2-edited"},
        {"old_text": "line3\n", "new_text": "line3\nline4\n"},
    ]
    out = call(srv, "edit_file", {"path": "out/log.txt", "edits": edits})
    assert out["result"] == "file edited successfully" and out["edits_applied"] == 2
    assert target.read_text() == "line1\nline2-edited\nline3\nline4\n"
    target.write_text("dup\ndup\n")
    dup = [{"old_text": "dup", "new_text": "x"}]
    out = call(srv, "edit_file", {"path": "out/log.txt", "edits": dup})
    assert "unique" in out["error"]
    target.write_text("line1\nline2\n")
    overlap = [
        {"old_text": "line1\nline2", "new_text": "a"},
        {"old_text": "line2", "new_text": "b"},
    ]
    assert "overlap" in call(srv, "edit_file", {"path": "out/log.txt", "edits": overlap})["error"]
    # typographic quotes and trailing blanks in the file still match plain old_text
    target.write_text("keep \u201cthis\u201d  \nsay \u2018hi\u2019\t\nlast\n")
    fuzzy = [{"old_text": "say 'hi'", "new_text": "say bye"}]
    call(srv, "edit_file", {"path": "out/log.txt", "edits": fuzzy})
    assert target.read_text() == "keep \u201cthis\u201d  \nsay bye\nlast\n"


def test_bad_parameters_are_400(srv) -> None:
    r = srv.client.post("/tools", json={"tool": "read_file", "params": {"path": 3}})
    assert r.status_code == 400 and "'path'" in r.json()["error"]["message"]
    r = srv.client.post("/tools", json={"tool": "read_file", "params": {}})
    assert r.status_code == 400
    r = srv.client.post("/tools", content=b"{not json")
    assert r.status_code == 400
    r = srv.client.post("/tools", json={"tool": "no_such_tool"})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == 'unknown tool "no_such_tool"'
    r = srv.client.post("/tools", json={"tool": "read_file", "params": {}, "stream": True})
    assert r.status_code == 404 and "does not support stream" in r.json()["error"]["message"]


def test_shell_streams_in_its_working_directory(srv, dirs) -> None:
    root, _ = dirs
    body = {"tool": "exec_shell_command", "params": {"command": "pwd; echo hello"}, "stream": True}
    events = [json.loads(e) for e in srv.sse("/tools", body, headers={"x-tool-cwd": "src"})]
    assert events[-1] == {"done": True}
    text = "".join(e["chunk"] for e in events[:-1])
    assert text == f"{root / 'src'}\nhello\n\n[exit code: 0]"
    out = call(
        srv, "exec_shell_command", {"command": "sleep 30 & echo started; wait", "timeout": 1}
    )
    assert out["plain_text_response"].startswith("started\n")
    assert "[exit due to timed out]" in out["plain_text_response"]


@pytest.mark.parametrize(
    "runtime,message",
    [
        ("fake:does-not-exist", "unknown tool runtime"),
        ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target"),
        ("docker-container:--privileged", "invalid container id"),
        ("podman-container:abc123", "is not available"),
    ],
)
def test_tool_runtime_header_is_refused(srv, runtime: str, message: str) -> None:
    body = {"tool": "exec_shell_command", "params": {"command": "echo hi"}}
    r = srv.client.post("/tools", json=body, headers={"x-tool-runtime": runtime})
    assert r.status_code == 500 and message in r.json()["error"]["message"]


def test_shell_only_when_named(tmp_path: Path) -> None:
    args = ["--tools", "read_file,grep_search", "--tools-root", str(tmp_path), "-np", "1"]
    with serve_in_thread(args) as s:
        assert [t["tool"] for t in s.client.get("/tools").json()] == ["read_file", "grep_search"]
        r = s.client.post(
            "/tools", json={"tool": "exec_shell_command", "params": {"command": "id"}}
        )
        assert r.status_code == 404
    with serve_in_thread(["-np", "1"]) as s:  # no --tools: the routes say so
        for r in (s.client.get("/tools"), s.client.post("/tools", json={"tool": "read_file"})):
            assert r.status_code == 403 and r.json()["error"]["type"] == "feature_disabled"


def test_tools_root_defaults_to_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    from loraserve.server.config.args import parse_server_args

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LORASERVE_TOOLS_ROOT", raising=False)
    assert parse_server_args(["--tools", "all"]).tools.root == os.path.realpath(tmp_path)
    monkeypatch.setenv("LORASERVE_TOOLS_ROOT", "/")
    assert parse_server_args(["--tools", "all"]).tools.root == "/"
