"""Obtain the peer, llama.cpp's `llama-server`, built from the llama-cpp-python sdist.

Lookup order: `$LORASERVE_PEER_BIN`; a build already in the cache
(`$LORASERVE_PEER_CACHE`, default `~/.cache/loraserve/peer`); the machine's prebuilt copy
under `/opt/peer`. `python -m bench.peer --build` downloads the sdist with pip and builds it
into the cache (several minutes on 2 cores). Nothing is written inside the repository.

`llama-quantize` (for the random-weights models of `bench.synth`) comes from the same build
tree: `$LORASERVE_QUANTIZE_BIN`, else next to the llama-server found, else the cache's build
tree; `python -m bench.peer --quantize --build` builds it there (about a minute more).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

SDIST_VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{SDIST_VERSION}"
BIN_REL = Path("vendor/llama.cpp/build/bin/llama-server")
QUANTIZE = "llama-quantize"
KNOWN_PREBUILT = (Path("/opt/peer") / SDIST / BIN_REL,)
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF"
    " -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF"
    " -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
).split()


def cache_dir() -> Path:
    """Where builds are cached: `$LORASERVE_PEER_CACHE` or `~/.cache/loraserve/peer`."""
    env = os.environ.get("LORASERVE_PEER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "loraserve" / "peer"


def _usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_peer() -> Path | None:
    """The llama-server binary to use, or None when there is none yet."""
    env = os.environ.get("LORASERVE_PEER_BIN")
    if env:
        path = Path(env).expanduser()
        if _usable(path):
            return path
        print(f"peer: LORASERVE_PEER_BIN={env} is not an executable file", file=sys.stderr)
        return None
    for path in (cache_dir() / SDIST / BIN_REL, *KNOWN_PREBUILT):
        if _usable(path):
            return path
    return None


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    print("peer: $", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, cwd=cwd, check=True)


def _build(target: str, jobs: int) -> Path | None:
    """Download the sdist (once) and build `target` in the cache's build tree."""
    root = cache_dir()
    src = root / SDIST
    llama = src / "vendor/llama.cpp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not (llama / "CMakeLists.txt").is_file():
            dl = root / "download"
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                  "-d", str(dl), f"llama-cpp-python=={SDIST_VERSION}"])  # fmt: skip
            archive = next(dl.glob(f"{SDIST}.tar.gz"))
            with tarfile.open(archive) as tar:
                tar.extractall(root, filter="data")
        if shutil.which("cmake") is None:
            raise RuntimeError("cmake is not installed")
        _run(["cmake", "-B", "build", *CMAKE_FLAGS], cwd=llama)
        _run(["cmake", "--build", "build", f"-j{jobs}", "--target", target], cwd=llama)
    except (OSError, RuntimeError, StopIteration, subprocess.CalledProcessError) as e:
        print(f"peer: cannot build {target} ({e})", file=sys.stderr)
        return None
    binary = src / BIN_REL.with_name(target)
    return binary if _usable(binary) else None


def build_peer(jobs: int = 2) -> Path | None:
    """Download the llama-cpp-python sdist and build llama-server into the cache.

    Returns the binary, or None (with a message saying why) when it cannot be built.
    """
    binary = _build("llama-server", jobs)
    if binary is None:
        print("peer: no llama-server; the peer columns will be skipped", file=sys.stderr)
    return binary


def find_quantize() -> Path | None:
    """`llama-quantize`: `$LORASERVE_QUANTIZE_BIN`, next to the llama-server `find_peer()`
    finds, or in the cache's build tree; None when there is none yet."""
    env = os.environ.get("LORASERVE_QUANTIZE_BIN")
    if env:
        path = Path(env).expanduser()
        if _usable(path):
            return path
        print(f"peer: LORASERVE_QUANTIZE_BIN={env} is not an executable file", file=sys.stderr)
        return None
    peer = find_peer()
    candidates = [peer.with_name(QUANTIZE)] if peer is not None else []
    candidates += [cache_dir() / SDIST / BIN_REL.with_name(QUANTIZE)]
    return next((p for p in candidates if _usable(p)), None)


def obtain_quantize(build: bool = True, jobs: int = 2) -> Path | None:
    """`find_quantize()`, else (when `build`) build it in the peer cache's build tree."""
    path = find_quantize()
    if path is not None or not build or os.environ.get("LORASERVE_QUANTIZE_BIN"):
        return path
    return _build(QUANTIZE, jobs)


def obtain_peer(build: bool = True) -> Path | None:
    """`find_peer()`, else (when `build`) `build_peer()`; None with a message if neither."""
    path = find_peer()
    if path is not None or os.environ.get("LORASERVE_PEER_BIN"):
        return path
    if not build:
        print("peer: no llama-server found; run `python -m bench.peer --build` or set "
              "LORASERVE_PEER_BIN; the peer columns will be skipped", file=sys.stderr)  # fmt: skip
        return None
    return build_peer()


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.peer [--quantize] [--build]`: print the peer binary (or
    llama-quantize), building it if asked."""
    ap = argparse.ArgumentParser(prog="python -m bench.peer", description=main.__doc__)
    ap.add_argument("--build", action="store_true", help="build into the cache if not found")
    ap.add_argument("--quantize", action="store_true", help="llama-quantize instead")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    if args.quantize:
        path = obtain_quantize(args.build, args.jobs)
    else:
        path = find_peer() or (build_peer(args.jobs) if args.build else None)
    if path is None:
        sys.exit(f"no {QUANTIZE if args.quantize else 'llama-server'} (try --build)")
    print(path)


if __name__ == "__main__":
    main()
