"""The compiled kernels are built and loaded only from a private directory, and a library only
when its owner and hash are right (issue 31 item 7).

The attack the issue ran: with an unwritable home, kernels went to a predictable
`loraserve-kernels-<uid>` under the system temp folder, and whatever library was there got
loaded. Here another user makes that folder first and plants a library (one whose
constructor leaves a marker file when loaded) under the exact name loraserve would load: a
fresh process refuses the folder, runs on the torch kernels, and the marker never appears.
The checks themselves are tested on crafted folders and files (hashes against hashlib).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loraserve import cbuild
from loraserve.kernels import trust

OTHER_UID = 12345
AS_ROOT = os.getuid() == 0
PLANTED_C = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("loaded", f); fclose(f); }
}
"""


def test_private_dir_is_made_0700(tmp_path: Path) -> None:
    d = trust.private_dir(tmp_path / "a" / "kernels")
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700


def test_our_open_dir_is_closed(tmp_path: Path) -> None:
    d = tmp_path / "k"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o777)
    trust.private_dir(d)
    assert (d.stat().st_mode & 0o777) == 0o700


def test_links_and_files_are_refused(tmp_path: Path) -> None:
    real = trust.private_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(trust.UntrustedPath, match="not a directory"):
        trust.private_dir(tmp_path / "link")
    (tmp_path / "file").write_text("x")
    with pytest.raises(trust.UntrustedPath):
        trust.private_dir(tmp_path / "file")


@pytest.mark.skipif(not AS_ROOT, reason="needs root to make a folder of another user")
def test_another_users_dir_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, OTHER_UID, OTHER_UID)
    with pytest.raises(trust.UntrustedPath, match=f"uid {OTHER_UID}"):
        trust.private_dir(d)
    assert (d.stat().st_mode & 0o777) == 0o700 and d.stat().st_uid == OTHER_UID  # untouched


def _lib(d: Path) -> Path:
    lib = d / "kernels-x.so"
    lib.write_bytes(b"\x7fELF not really, but bytes to hash" * 100)
    os.chmod(lib, 0o755)
    return lib


def test_a_library_loads_only_with_its_recorded_hash(tmp_path: Path) -> None:
    d = trust.private_dir(tmp_path / "k")
    lib = _lib(d)
    with pytest.raises(trust.UntrustedPath, match="no recorded hash"):
        trust.open_verified(lib)
    trust.record(lib)
    side = lib.with_name(lib.name + ".sha256").read_text().strip()
    assert side == hashlib.sha256(lib.read_bytes()).hexdigest()
    path, fd = trust.open_verified(lib)
    try:
        assert os.path.samefile(path, lib)  # the very file (through its descriptor)
    finally:
        os.close(fd)
    with open(lib, "r+b") as f:  # one byte changed after the build
        f.seek(10)
        f.write(b"X")
    with pytest.raises(trust.UntrustedPath, match="SHA-256"):
        trust.open_verified(lib)


def test_links_writable_and_foreign_libraries_are_refused(tmp_path: Path) -> None:
    d = trust.private_dir(tmp_path / "k")
    lib = _lib(d)
    trust.record(lib)
    link = d / "kernels-y.so"
    link.symlink_to(lib)
    trust.record(link, lib)  # even with the right hash recorded
    with pytest.raises(trust.UntrustedPath, match="links"):
        trust.open_verified(link)
    os.chmod(lib, 0o775)
    with pytest.raises(trust.UntrustedPath, match="writable by group or others"):
        trust.open_verified(lib)
    os.chmod(lib, 0o755)
    if AS_ROOT:
        os.chown(lib, OTHER_UID, OTHER_UID)
        with pytest.raises(trust.UntrustedPath, match=f"uid {OTHER_UID}"):
            trust.open_verified(lib)


def test_prebuilt_folder_rules(tmp_path: Path) -> None:
    d = tmp_path / "pre"
    d.mkdir(mode=0o755)
    assert trust.trusted_dir(d)  # the package's own folder: readable by all is fine
    os.chmod(d, 0o775)
    assert not trust.trusted_dir(d)
    os.chmod(d, 0o755)
    if AS_ROOT:
        os.chown(d, OTHER_UID, OTHER_UID)
        assert not trust.trusted_dir(d)


@pytest.mark.skipif(not AS_ROOT, reason="needs root to plant as another user")
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_a_planted_library_in_the_temp_fallback_is_never_loaded(tmp_path: Path) -> None:
    cc = cbuild._compiler()
    assert cc is not None
    marker = tmp_path / "LOADED"
    src = tmp_path / "planted.c"
    src.write_text(PLANTED_C % marker)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    theirs = tmpdir / f"loraserve-kernels-{os.getuid()}"
    theirs.mkdir(mode=0o777)
    os.chmod(theirs, 0o777)
    planted = theirs / f"{cbuild.LIBRARY}-{cbuild._key(cc)}.so"  # the exact name loaded
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(planted)], check=True)
    trust.record(planted)  # the attacker can write a matching hash file too
    for p in (theirs, planted, planted.with_name(planted.name + ".sha256")):
        os.chown(p, OTHER_UID, OTHER_UID)
    home_file = tmp_path / "not-a-home"  # an unwritable cache: its folder cannot be made
    home_file.write_text("")
    env = {
        **os.environ,
        "TMPDIR": str(tmpdir),
        "LORASERVE_CACHE": str(home_file / "cache"),
        "LORASERVE_PREBUILT_DIR": str(tmp_path / "no-prebuilt"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    run = subprocess.run(
        [sys.executable, "-c", "from loraserve import kernels; print(kernels.backend())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "torch"
    assert f"owned by uid {OTHER_UID}" in run.stderr
    assert not marker.exists(), "the planted library was loaded"
