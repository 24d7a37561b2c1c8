"""The MCP client against real stdio servers (tests/data/mcp/fixture_server.py) that
answer, hang, crash, print garbage or leave a grandchild holding the pipes: tool discovery,
calls, per-call timeouts, lazy respawn after a crash, and a shutdown that never hangs."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from loraserve.server.tools import mcp_manager
from loraserve.server.tools.mcp_config import McpServerConfig
from loraserve.server.tools.mcp_manager import McpManager

FIXTURE = str(Path(__file__).resolve().parents[2] / "data" / "mcp" / "fixture_server.py")


def server(name: str, mode: str, *extra: str, timeout_ms: int = 10000) -> McpServerConfig:
    return McpServerConfig(name, sys.executable, (FIXTURE, mode, *extra), timeout_ms=timeout_ms)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split(")")[-1].split()[0] != "Z"


def gone(pid: int) -> bool:
    """Whether `pid` ends within 2 s (a SIGKILL takes effect shortly after it is sent)."""
    for _ in range(100):
        if not alive(pid):
            return True
        time.sleep(0.02)
    return False


def test_discovery_and_calls() -> None:
    async def go():
        m = McpManager((server("a", "ok"), server("b", "garbage")))
        await m.warmup()
        names = sorted(f"{t.server}_{t.name}" for t in m.tools)
        assert names == sorted(f"{s}_{t}" for s in "ab" for t in ("echo", "crash", "fail", "two"))
        echo = next(t for t in m.tools if t.server == "a" and t.name == "echo")
        assert echo.input_schema["required"] == ["message"]
        assert next(t for t in m.tools if t.name == "two").input_schema == {}
        # warmup stopped its processes: nothing is kept running
        assert m.transports == {}
        for s in "ab":
            out = await m.call_tool(s, "echo", {"message": "hi"})
            assert out["plain_text_response"].startswith("echo: hi pid=")
        assert await m.call_tool("a", "two", {}) == {"plain_text_response": "a\nb"}
        assert await m.call_tool("a", "fail", {}) == {"error": "it failed"}
        assert await m.call_tool("a", "nope", {}) == {"error": "no such method"}
        assert await m.call_tool("zz", "echo", {}) == {"error": "MCP server unavailable: zz"}
        many = await asyncio.gather(*(m.call_tool("b", "echo", {"message": i}) for i in range(20)))
        assert [r["plain_text_response"].split(" pid")[0] for r in many] == [
            f"echo: {i}" for i in range(20)
        ]
        await m.shutdown()

    run(go())


def test_crash_then_lazy_respawn() -> None:
    async def go():
        m = McpManager((server("c", "ok"),))
        first = await m.call_tool("c", "echo", {"message": "x"})
        pid1 = int(first["plain_text_response"].rsplit("=", 1)[1])
        assert await m.call_tool("c", "crash", {}) == {"plain_text_response": ""}
        for _ in range(100):  # the exit is seen by the event loop shortly after
            if not m.transports["c"].alive:
                break
            await asyncio.sleep(0.02)
        second = await m.call_tool("c", "echo", {"message": "y"})
        pid2 = int(second["plain_text_response"].rsplit("=", 1)[1])
        assert pid1 != pid2 and gone(pid1)
        await m.shutdown()
        assert gone(pid2)

    run(go())


def test_hanging_server_times_out_and_shutdown_is_prompt(monkeypatch) -> None:
    monkeypatch.setattr(mcp_manager, "WARMUP_TIMEOUT_S", 0.5)

    async def go():
        m = McpManager(
            (
                server("h", "hang", timeout_ms=300),
                server("i", "hang-init", timeout_ms=300),
                server("ok", "ok"),
                McpServerConfig("bad", "/no/such/program-12345"),
            )
        )
        await m.warmup()  # bounded: the silent server costs WARMUP_TIMEOUT_S, not forever
        assert {t.server for t in m.tools} == {"h", "ok"}
        assert await m.call_tool("h", "echo", {"message": "x"}) == {"error": "request timed out"}
        out = await m.call_tool("i", "echo", {})
        assert out == {"error": "initialize failed: request timed out"}
        assert await m.call_tool("bad", "echo", {}) == {"error": "MCP server unavailable: bad"}
        # a call in flight when shutdown starts ends at once with an error
        m.configs["h"] = server("h", "hang", timeout_ms=60000)
        pending = asyncio.create_task(m.call_tool("h", "echo", {"message": "x"}))
        await asyncio.sleep(0.3)
        await asyncio.wait_for(m.shutdown(), 3)
        assert "error" in await asyncio.wait_for(pending, 3)
        assert await m.call_tool("ok", "echo", {"message": "late"}) == {
            "error": "MCP server unavailable: ok"
        }

    run(go())


def test_grandchild_holding_the_pipes_never_hangs(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"

    async def go():
        m = McpManager((server("g", "grandchild", str(pidfile)),))
        await asyncio.wait_for(m.warmup(), 5)  # warmup's own close must not hang either
        assert [t.name for t in m.tools][:1] == ["echo"]
        warm_pid = int(pidfile.read_text())
        assert gone(warm_pid)  # the whole process group went with the server
        out = await m.call_tool("g", "echo", {"message": "hi"})
        assert out["plain_text_response"].startswith("echo: hi")
        live_pid = int(pidfile.read_text())
        assert live_pid != warm_pid and alive(live_pid)
        await asyncio.wait_for(m.shutdown(), 3)
        assert gone(live_pid)

    run(go())


@pytest.mark.parametrize("mode", ["grandchild", "hang"])
def test_escaped_grandchild_does_not_block_close(tmp_path: Path, mode: str) -> None:
    """A descendant in another session keeps the pipes open after the group is killed:
    close still returns (it does not wait for an end of file)."""
    script = tmp_path / "escape.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)'],"
        " start_new_session=True)\n"
        f"sys.argv = [sys.argv[0], {mode!r}, {str(tmp_path / 'p')!r}]\n"
        f"exec(open({FIXTURE!r}).read())\n"
    )

    async def go():
        m = McpManager((McpServerConfig("e", sys.executable, (str(script),), timeout_ms=300),))
        await asyncio.wait_for(m.warmup(), 5)
        assert any(t.name == "echo" for t in m.tools)
        await m.call_tool("e", "echo", {"message": "x"})
        await asyncio.wait_for(m.shutdown(), 3)

    run(go())
