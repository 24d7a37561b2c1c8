"""A stdio MCP server for the tests (one JSON-RPC message per line), misbehaving on demand:

    python fixture_server.py MODE [PIDFILE]

MODE: `ok`; `garbage` (prints non-JSON lines, JSON that is not an object, a notification,
a request of its own and an answer to an unknown id before every answer); `hang` (answers
`initialize` and `tools/list`, never `tools/call`); `hang-init` (never answers anything);
`grandchild` (first starts a grandchild that inherits the pipes and sleeps 60 s, writing its
pid to PIDFILE). Tools: `echo` (text "echo: MESSAGE pid=PID"), `crash` (answers, then the
process exits), `fail` (an `isError` result), `two` (two text parts).
"""

import json
import os
import subprocess
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
TOOLS = [
    {
        "name": "echo",
        "description": "Echo back the input message",
        "inputSchema": {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
    },
    {"name": "crash", "description": "Answer, then exit", "inputSchema": {"type": "object"}},
    {"name": "fail", "description": "An isError result", "inputSchema": {"type": "object"}},
    {"name": "two", "description": "Two text parts"},
]


def send(obj) -> None:
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stdout.flush()


def answer(req_id, method, params):
    if method == "initialize":
        info = {"name": f"fixture-{MODE}", "version": "1.0"}
        return {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": info}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        name, args = params.get("name"), params.get("arguments") or {}
        if name == "echo":
            text = f"echo: {args.get('message', '')} pid={os.getpid()}"
            return {"content": [{"type": "text", "text": text}]}
        if name == "fail":
            return {"content": [{"type": "text", "text": "it failed"}], "isError": True}
        if name == "two":
            return {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        if name == "crash":
            send({"jsonrpc": "2.0", "id": req_id, "result": {"content": []}})
            os._exit(3)
    raise KeyError(method)


def main() -> None:
    if MODE == "grandchild":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        with open(sys.argv[2], "w") as f:
            f.write(str(child.pid))
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if "id" not in req:
            continue  # a notification
        method = req.get("method")
        if MODE == "hang-init" or (MODE == "hang" and method == "tools/call"):
            continue
        if MODE == "garbage":
            send("this is not json {")
            send("[1, 2, 3]")
            send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}})
            send({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"})
            send({"jsonrpc": "2.0", "id": 987654, "result": {}})
        try:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": req["id"],
                    "result": answer(req["id"], method, req.get("params") or {}),
                }
            )
        except KeyError:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": req["id"],
                    "error": {"code": -32601, "message": "no such method"},
                }
            )


if __name__ == "__main__":
    main()
