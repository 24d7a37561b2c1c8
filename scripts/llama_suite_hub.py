"""A local stand-in for the Hugging Face hub, for `llama_suite.py`: the repositories llama.cpp's
router tests download from (`test_router_download_model`, `test_router_delete_model`,
`test_router_remote_preset`) served over plain HTTP on 127.0.0.1, and both servers pointed at
it with `MODEL_ENDPOINT` (llama.cpp's `common_get_model_endpoint`; loraserve reads it too), so
both really download, offline.

It answers the three requests llama.cpp's downloader makes (common/hf-cache.cpp,
common/download.cpp): `GET api/models/ORG/NAME/refs`, `GET api/models/ORG/NAME/tree/COMMIT`
and `HEAD`/`GET ORG/NAME/resolve/COMMIT/PATH`; anything else is a 404, as the hub answers a
repository it does not have (llama-server then falls back to its cache).

The repositories: `ggml-org/test-preset-ci` holds a `preset.ini` whose two presets name models
of the suite's cache (`llama_suite_tree.ROUTER_MODELS`; the real repository's text is not
available offline, these are the two ids the test checks), and
`ggml-org/test-model-router-download` one F16-tagged GGUF, the suite's model.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "1" * 40
PRESET_INI = """\
[tinygemma3-preset]
hf-repo = ggml-org/tinygemma3-GGUF:Q8_0
ctx-size = 1024

[stories260K-test]
hf-repo = ggml-org/test-model-stories260K
"""


def hub_repos(model: Path) -> dict[str, dict[str, bytes | Path]]:
    """Repository id -> path in it -> its bytes (or the file holding them)."""
    return {
        "ggml-org/test-preset-ci": {"preset.ini": PRESET_INI.encode()},
        "ggml-org/test-model-router-download": {"router-download-F16.gguf": model},
    }


def _size(data: bytes | Path) -> int:
    return len(data) if isinstance(data, bytes) else data.stat().st_size


def _oid(data: bytes | Path) -> str:
    """A content id: the sha256 of the bytes (what the hub gives as an LFS file's oid)."""
    h = hashlib.sha256()
    if isinstance(data, bytes):
        h.update(data)
    else:
        with open(data, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def serve(repos: dict[str, dict[str, bytes | Path]]) -> tuple[ThreadingHTTPServer, str]:
    """Start the stand-in on a free port in a daemon thread: the server and its URL."""
    oids = {(r, p): _oid(d) for r, files in repos.items() for p, d in files.items()}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _json(self, body: object) -> None:
            raw = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _missing(self) -> None:
            raw = b'{"error":"Repository not found"}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _route(self, head: bool) -> None:
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 5:
                repo = "/".join(parts[2:4])
                if repo in repos and parts[4:] == ["refs"]:
                    return self._json(
                        {"branches": [{"name": "main", "ref": "refs/heads/main",
                                       "targetCommit": COMMIT}], "converts": [], "tags": []}
                    )  # fmt: skip
                if repo in repos and parts[4:] == ["tree", COMMIT]:
                    return self._json(
                        [
                            {"type": "file", "path": p, "size": _size(d), "oid": oids[repo, p][:40],
                             "lfs": {"oid": oids[repo, p], "size": _size(d)}}
                            for p, d in repos[repo].items()
                        ]
                    )  # fmt: skip
                return self._missing()
            repo, path = "/".join(parts[:2]), "/".join(parts[4:])
            if parts[2:4] != ["resolve", COMMIT] or path not in repos.get(repo, {}):
                return self._missing()
            data = repos[repo][path]
            self.send_response(200)
            self.send_header("Content-Length", str(_size(data)))
            self.send_header("ETag", f'"{oids[repo, path]}"')
            self.send_header("Accept-Ranges", "none")
            self.end_headers()
            if head:
                return None
            if isinstance(data, bytes):
                self.wfile.write(data)
                return None
            with open(data, "rb") as f:
                while chunk := f.read(1 << 20):
                    self.wfile.write(chunk)
            return None

        def do_GET(self) -> None:  # noqa: N802
            self._route(head=False)

        def do_HEAD(self) -> None:  # noqa: N802
            self._route(head=True)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"
