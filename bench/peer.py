"""Obtain the peer, llama.cpp's `llama-server`, built from the llama-cpp-python sdist.

Lookup order: `$LORASERVE_PEER_BIN`; a build already in the cache
(`$LORASERVE_PEER_CACHE`, default `~/.cache/loraserve/peer`); the machine's prebuilt copy
under `/opt/peer`. `python -m bench.peer --build` downloads the sdist with pip and builds it
into the cache (several minutes on 2 cores). Nothing is written inside the repository.
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


def build_peer(jobs: int = 2) -> Path | None:
    """Download the llama-cpp-python sdist and build llama-server into the cache.

    Returns the binary, or None (with a message saying why) when it cannot be built.
    """
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        src = root / SDIST
        if not (src / "vendor/llama.cpp/CMakeLists.txt").is_file():
            dl = root / "download"
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                  "-d", str(dl), f"llama-cpp-python=={SDIST_VERSION}"])  # fmt: skip
            archive = next(dl.glob(f"{SDIST}.tar.gz"))
            with tarfile.open(archive) as tar:
                tar.extractall(root, filter="data")
        llama = src / "vendor/llama.cpp"
        for tool in ("cmake",):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not installed")
        _run(["cmake", "-B", "build", *CMAKE_FLAGS], cwd=llama)
        _run(["cmake", "--build", "build", f"-j{jobs}", "--target", "llama-server"], cwd=llama)
    except (OSError, RuntimeError, StopIteration, subprocess.CalledProcessError) as e:
        print(f"peer: cannot build llama-server ({e}); the peer columns will be skipped",
              file=sys.stderr)  # fmt: skip
        return None
    binary = src / BIN_REL
    return binary if _usable(binary) else None


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
    """`python -m bench.peer [--build]`: print the peer binary, building it if asked."""
    ap = argparse.ArgumentParser(prog="python -m bench.peer", description=main.__doc__)
    ap.add_argument("--build", action="store_true", help="build into the cache if not found")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    path = find_peer() or (build_peer(args.jobs) if args.build else None)
    if path is None:
        sys.exit("no llama-server (try --build)")
    print(path)


if __name__ == "__main__":
    main()
