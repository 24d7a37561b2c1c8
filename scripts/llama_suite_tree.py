"""The suite's tree for `llama_suite.py`: llama.cpp's `tools/server/tests` copied with its
layout, the server wrapper that maps its download flags to local files, and the download
cache (a Hugging Face hub cache in the suite's `tmp/`) holding the models its router tests
name."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peer import SDIST, cache_dir  # noqa: E402

WRAPPER = '''#!{python}
"""The suite's server binary: rewrites download flags to local files (but those of the
stand-in hub's repositories), runs the target."""
import json, os, signal, subprocess, sys, time, ctypes
args, out, skip = sys.argv[1:], [], {{"--hf-repo", "-hf", "-hfr", "--hf-file", "-hff",
    "--model-url", "-mu", "--mmproj-url", "-mmu"}}
model, has_model, i = os.environ["SUITE_MODEL"], False, 0
wants_model, hub = False, os.environ.get("SUITE_HUB_REPOS", "").split(",")
while i < len(args):
    a = args[i]
    if a in ("--hf-repo", "-hf", "-hfr") and args[i + 1:i + 2] and args[i + 1].split(":")[0] in hub:
        out += args[i:i + 2]  # a repository the suite's stand-in hub serves: downloaded
        has_model = True
        i += 2
        continue
    if a in skip:
        wants_model = wants_model or a not in ("--mmproj-url", "-mmu")
        i += 2
        continue
    if a in ("-m", "--model"):
        has_model = True
    out.append(a)
    i += 1
if wants_model and not has_model:
    out = ["--model", model, *out]
if os.environ["SUITE_TARGET"] == "llama":
    cmd = [os.environ["SUITE_LLAMA_BIN"], *out]
else:
    cmd = [sys.executable, "-c", "import sys; from loraserve.cli import main; main(sys.argv[1:])",
           *out]
libc = ctypes.CDLL(None)
child = subprocess.Popen(cmd, preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))
stopped = []
def forward(sig, frame):
    stopped.append(sig)
    child.send_signal(sig)
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
t0 = time.time()
rc = child.wait()
with open(os.environ["SUITE_EXITS"], "a") as f:
    f.write(json.dumps({{"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "rc": rc,
        "stopped": bool(stopped), "seconds": round(time.time() - t0, 1), "args": out}}) + "\\n")
sys.exit(rc if rc >= 0 else 128 - rc)
'''


def prepare(work: Path, model: Path, start_s: int = 0) -> Path:
    """The suite's copy under ``work/llama.cpp`` (tree layout kept); its tests folder.
    `start_s`: the seconds a server may take to start (0: the suite's own 60)."""
    src = cache_dir() / SDIST / "vendor" / "llama.cpp"
    if not (src / "tools/server/tests").is_dir():
        sys.exit(f"no llama.cpp tree at {src}: run `python -m bench.peer` first")
    tree = work / "llama.cpp"
    if tree.exists():
        shutil.rmtree(tree)
    for part in ("tools/server/tests", "models/templates"):
        shutil.copytree(src / part, tree / part)
    (tree / "tools/mtmd").mkdir(parents=True)
    for image in (src / "tools/mtmd").glob("*.jpeg"):
        shutil.copy(image, tree / "tools/mtmd" / image.name)
    tests = tree / "tools/server/tests"
    if start_s:  # a loaded machine: more time for a server to start (the suite's default: 60)
        utils = tests / "utils.py"
        text = utils.read_text()
        utils.write_text(
            text.replace("DEFAULT_HTTP_TIMEOUT = 60", f"DEFAULT_HTTP_TIMEOUT = {start_s}")
        )
    (tests / "wget.py").write_text(
        "def download(url, out=None):\n"
        "    raise RuntimeError(f'the suite run is offline: no download of {url}')\n"
    )
    adapters = ROOT / "loraserve/adapters"
    tmp = tests / "tmp"
    tmp.mkdir()
    for name, target in {
        "moe_shakespeare15M.gguf": adapters / "uppercase.gguf",
        "Llama-3-Instruct-abliteration-LoRA-8B-f16.gguf": adapters / "titlecase.gguf",
        "stories15M-q4_0.gguf": model,
    }.items():
        (tmp / name).symlink_to(target)
    router_cache(tmp, model)
    wrapper = work / "server-wrapper"
    wrapper.write_text(WRAPPER.format(python=sys.executable))
    wrapper.chmod(0o755)
    return tests


# The download-cache models llama.cpp's router tests name (test_router.py); its download test's
# model is left out (nothing is downloaded). The commit is any valid one.
ROUTER_MODELS = {
    "ggml-org/tinygemma3-GGUF": "tinygemma3-Q8_0.gguf",
    "ggml-org/test-model-stories260K": "stories260K-F32.gguf",
    "ggml-org/test-model-stories260K-infill": "stories260K-infill-F32.gguf",
}
CACHE_COMMIT = "0" * 40


def router_cache(tmp: Path, model: Path) -> None:
    """A Hugging Face hub cache in ``tmp`` (the suite's LLAMA_CACHE) holding the router tests'
    models, each a hard link to ``model`` (a copy across file systems): both routers list
    it, and each model is its own file, as each is a process of its own in llama-server's
    router (loraserve's router shares one engine between ids of one file)."""
    for repo_id, name in ROUTER_MODELS.items():
        folder = tmp / ("models--" + repo_id.replace("/", "--"))
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text(CACHE_COMMIT)
        snapshot = folder / "snapshots" / CACHE_COMMIT
        snapshot.mkdir(parents=True)
        try:
            os.link(model, snapshot / name)
        except OSError:
            shutil.copy(model, snapshot / name)
