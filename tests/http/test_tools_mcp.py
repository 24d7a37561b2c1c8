"""MCP servers, the API key, CORS and the MCP proxy over HTTP: a `loraserve` process with
`--mcp-servers-json` lists `<server>_<tool>` tools and calls them; the API key guards
`/tools` and `/cors-proxy`; tools narrow CORS to localhost unless `--cors-origins` is given
(llama-server's rule); a SIGTERM while a tool call hangs, or while a grandchild holds an MCP
server's pipes, ends the process within 3 s (llama.cpp's test_mcp_servers asks the same)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.server_util import serve_in_thread, start_process

FIXTURE = str(Path(__file__).resolve().parents[1] / "data" / "mcp" / "fixture_server.py")
KEY = "sk-tools"


def mcp_json(**servers: list[str]) -> str:
    conf = {n: {"command": sys.executable, "args": [FIXTURE, *a]} for n, a in servers.items()}
    return json.dumps({"mcpServers": conf})


def gone(pid: int) -> bool:
    for _ in range(100):
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.02)
    return False


def stop_within(proc: subprocess.Popen, seconds: float) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the server did not stop within {seconds} s of SIGTERM")


def test_mcp_tools_over_http_and_prompt_shutdown(tmp_path: Path) -> None:
    pidfile = tmp_path / "gc.pid"
    servers = mcp_json(echo=["garbage"], slow=["hang"], gc=["grandchild", str(pidfile)])
    proc, url = start_process(["--mcp-servers-json", servers, "-np", "1", "--api-key", KEY])
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        assert httpx.get(f"{url}/tools").status_code == 401
        assert httpx.post(f"{url}/tools", json={"tool": "echo_echo"}).status_code == 401
        assert httpx.get(f"{url}/cors-proxy?url=http://127.0.0.1:1/").status_code == 401
        tools = httpx.get(f"{url}/tools", headers=auth).json()
        names = [t["tool"] for t in tools]  # MCP only: no built-in tool without --tools
        assert sorted(names) == sorted(f"{s}_{t}" for s in ("echo", "slow", "gc")
                                       for t in ("echo", "crash", "fail", "two"))  # fmt: skip
        echo = next(t for t in tools if t["tool"] == "echo_echo")
        assert echo["type"] == "mcp" and echo["definition"]["function"]["parameters"] == {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        }
        body = {"tool": "echo_echo", "params": {"message": "hi"}}
        out = httpx.post(f"{url}/tools", json=body, headers=auth).json()
        assert out["plain_text_response"].startswith("echo: hi pid=")
        body = {"tool": "gc_echo", "params": {"message": "hi"}}
        assert "plain_text_response" in httpx.post(f"{url}/tools", json=body, headers=auth).json()
        grandchild = int(pidfile.read_text())
        result: list[object] = []

        def hanging_call() -> None:
            body = {"tool": "slow_echo", "params": {"message": "x"}}
            try:
                result.append(httpx.post(f"{url}/tools", json=body, headers=auth, timeout=30))
            except httpx.HTTPError as e:
                result.append(e)

        t = threading.Thread(target=hanging_call)
        t.start()
        time.sleep(1.0)
        stop_within(proc, 3.0)
        t.join(5)
        assert result, "the hanging call never returned"
        assert gone(grandchild)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cors_narrowed_to_localhost_when_tools_are_on(tmp_path: Path) -> None:
    pre = {"Access-Control-Request-Method": "POST"}
    for args, evil_allowed in (
        (["--tools", "read_file", "--tools-root", str(tmp_path)], False),
        (["--mcp-servers-json", mcp_json(echo=["ok"])], False),
        (["--tools", "read_file", "--tools-root", str(tmp_path), "--cors-origins", "*"], True),
        ([], True),
    ):
        with serve_in_thread([*args, "-np", "1"]) as s:
            evil = s.client.options("/tools", headers={"Origin": "http://evil.example", **pre})
            local = s.client.options("/tools", headers={"Origin": "http://localhost:5173", **pre})
            got = evil.headers.get("access-control-allow-origin")
            assert got == ("http://evil.example" if evil_allowed else None), args
            assert local.headers["access-control-allow-origin"] == "http://localhost:5173"


class _Target(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, "x_test": self.headers.get("x-test")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_cors_proxy() -> None:
    target = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{target.server_port}"
    try:
        with serve_in_thread(["-np", "1"]) as s:
            r = s.client.get(f"/cors-proxy?url={base}/x")
            assert r.status_code == 403 and r.json()["error"]["type"] == "feature_disabled"
        with serve_in_thread(["--ui-mcp-proxy", "-np", "1", "--api-key", KEY]) as s:
            auth = {"Authorization": f"Bearer {KEY}"}
            assert s.client.get(f"/cors-proxy?url={base}/x").status_code == 401
            headers = {**auth, "x-llama-server-proxy-header-x-test": "passed"}
            r = s.client.get(f"/cors-proxy?url={base}/a/b?q=1", headers=headers)
            assert r.status_code == 200 and r.json() == {"path": "/a/b?q=1", "x_test": "passed"}
            r = s.client.post(f"/cors-proxy?url={base}/", json={}, headers=auth)
            assert r.status_code == 204 and r.content == b""
            for bad in ("ftp://127.0.0.1/", "http://user:pw@127.0.0.1/", "nohost"):
                r = s.client.get("/cors-proxy", params={"url": bad}, headers=auth)
                assert r.status_code == 400, bad
    finally:
        target.shutdown()
        target.server_close()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mcp-servers-json", "not valid json"], "failed to parse MCP config JSON"),
        (["--mcp-servers-config", "/nonexistent/path.json"], "failed to open MCP config file"),
        (["--tools", "read_file,nope"], 'unknown tool "nope"'),
        (["--tools-runtime", "docker-container:--privileged"], "invalid container id"),
        (["--tools-runtime", "lxc:foo"], "unknown tool runtime"),
    ],
)
def test_bad_tools_flags_stop_the_start(args: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loraserve.cli", *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and message in out.stderr
