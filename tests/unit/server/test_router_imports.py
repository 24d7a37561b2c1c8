"""The router process starts on Starlette alone (issue 30, its start time: llama-server's router
answers in 0.03 s): building the router's app from a preset file, as `loraserve` without `-m`
does before it listens, imports neither torch (its engines run in child processes) nor
FastAPI, pydantic or httpx (~0.35 s and ~0.1 s of imports; httpx comes with the first engine
process, the proxy or a download). Checked in a fresh interpreter, whose `sys.modules` is the
oracle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.server_util import tiny_model_path

HEAVY = ("torch", "fastapi", "pydantic", "pydantic_core", "httpx")

SCRIPT = """
import json, sys
from loraserve.server.config.args import parse_server_args
from loraserve.server.process import serve
from loraserve.server.router.app import create_router_app
app = create_router_app(parse_server_args(sys.argv[1:]))
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_router_app_imports_no_heavy_package(tmp_path: Path) -> None:
    ini = tmp_path / "presets.ini"
    ini.write_text(
        "[*]\nc = 256\n"
        + "".join(f"[p{i}]\nmodel = {tiny_model_path()}\ntemp = 0.{i}\n" for i in range(3))
        + "[dl]\nhf-repo = org/not-cached:Q8_0\n"  # a download at load: nothing imported now
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, "--models-preset", str(ini), "--tools", "read_file"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert "starlette" in loaded and "uvicorn" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
