"""The kernel build: torch-free to import (the command line compiles while torch loads), one
library built into an empty cache, and the pure-torch fallback when the kernels are off."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


def _run(code: str, **env: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_importing_the_build_does_not_import_torch() -> None:
    code = "import sys, loraserve.cbuild; print('torch' in sys.modules)"
    assert _run(code) == "False"


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no cc")
def test_a_cold_cache_gets_one_library_built_in_the_background(tmp_path) -> None:
    code = (
        "from loraserve import cbuild\n"
        "cbuild.prebuild()\n"  # started before torch is imported
        "import loraserve.kernels as K\n"
        "print(K.backend(), len(list(cbuild.cache_dir().glob('kernels-*.so'))))"
    )
    env = {"LORASERVE_CACHE": str(tmp_path), "LORASERVE_PREBUILT_DIR": str(tmp_path / "none")}
    assert _run(code, **env) == "c 1"
    # a second start finds it and builds nothing
    assert _run(code, **env) == "c 1"


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no cc")
def test_kernels_built_at_install_serve_a_start_with_an_empty_cache(tmp_path) -> None:
    pre, cache = tmp_path / "package", tmp_path / "cache"
    env = {"LORASERVE_CACHE": str(cache), "LORASERVE_PREBUILT_DIR": str(pre)}
    subprocess.run([sys.executable, "-m", "loraserve.cli", "build-kernels"], check=True,
                   env={**os.environ, **env}, capture_output=True)  # fmt: skip
    assert len(list(pre.glob("kernels-*.so"))) == 1
    code = (
        "from loraserve import cbuild\n"
        "cbuild.prebuild()\n"
        "import loraserve.kernels as K\n"
        "print(K.backend(), len(list(cbuild.cache_dir().glob('kernels-*.so'))))"
    )
    assert _run(code, **env) == "c 0"  # loaded from the package: nothing built again


def test_disabled_kernels_fall_back_to_torch(tmp_path) -> None:
    code = "import loraserve.kernels as K; print(K.backend())"
    assert _run(code, LORASERVE_NO_C_KERNELS="1", LORASERVE_CACHE=str(tmp_path)) == "torch"


def test_build_kernels_refuses_unknown_arguments(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "loraserve.cli", "build-kernels", "--bogus"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LORASERVE_PREBUILT_DIR": str(tmp_path)})  # fmt: skip
    assert out.returncode == 2
    assert "unrecognized arguments: --bogus" in out.stderr
    assert not list(tmp_path.glob("kernels-*.so"))  # nothing built
