"""Which compiled kernel library may be loaded: loading a shared library runs its code, so a
file another user could have put or changed must never be loaded (issue 31 item 7).

- Libraries are built, and loaded from, only a *private* directory: one owned by this user
  with mode 0700, no symlink (`private_dir` creates it so, or refuses it). The fallback
  under the system temp folder (`loraserve-kernels-<uid>`, a predictable name) is checked
  the same way: if someone else made it first, it is refused, never used.
- The package's prebuilt folder (`loraserve build-kernels`) is trusted as the package's own
  code is: owned by this user or root and writable by nobody else (`trusted_dir`).
- A library is loaded only if it is a regular file (not a link) owned by this user (or root,
  in the package's folder), writable by nobody else, and its SHA-256 is the one recorded
  when it was built (`record`, a ``.sha256`` file beside it). The bytes hashed are those
  loaded: the file is opened once, checked through its descriptor, and loaded through
  ``/proc/self/fd`` where there is one (`open_verified`).

Torch-free, like `cbuild` (which loads this file without importing the kernels package).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

PRIVATE_MODE = 0o700


class UntrustedPath(Exception):
    """A directory or library that must not be built into or loaded from; says why."""


def _owners(allow_root: bool) -> set[int]:
    uid = os.getuid()
    return {uid, 0} if allow_root else {uid}


def private_dir(path: Path) -> Path:
    """``path``, created with mode 0700 if missing, once checked to be a directory (not a
    link) owned by this user with no permission for group or others (one of ours that
    allows more is set to 0700); else `UntrustedPath` (OSError if it cannot be made)."""
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=PRIVATE_MODE)
        except FileExistsError:  # made meanwhile: checked below like any other
            pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UntrustedPath(f"{path} is not a directory (a link or a file)")
    if st.st_uid != os.getuid():
        raise UntrustedPath(f"{path} is owned by uid {st.st_uid}, not by this user")
    if st.st_mode & 0o077:  # ours (made before this check existed): closed to others now
        os.chmod(path, PRIVATE_MODE)
        st = os.lstat(path)
    if st.st_mode & 0o077:
        raise UntrustedPath(
            f"{path} has mode {stat.S_IMODE(st.st_mode):o}: group or others may use it "
            f"(kernels are built only in a directory of mode 700)"
        )
    return path


def trusted_dir(path: Path) -> bool:
    """Whether the package's prebuilt folder may hold a library to load: a directory (not a
    link) owned by this user or root that no one else may write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid in _owners(allow_root=True)
        and not st.st_mode & 0o022
    )


def _sidecar(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sha256")


def recorded(lib: Path) -> bool:
    """Whether ``lib`` and its recorded hash are both there (it may be worth verifying)."""
    return lib.is_file() and _sidecar(lib).is_file()


def record(lib: Path, built: Path | None = None) -> None:
    """Record the SHA-256 of the library about to be at ``lib`` (its bytes now at ``built``,
    else at ``lib``), beside it: what `open_verified` will accept."""
    digest = hashlib.sha256((built or lib).read_bytes()).hexdigest()
    side = _sidecar(lib)
    tmp = side.with_name(f".{side.name}.{os.getpid()}")
    tmp.write_text(digest + "\n")
    os.replace(tmp, side)


def open_verified(lib: Path, allow_root: bool = False) -> tuple[str, int]:
    """Open ``lib`` and check it (a regular file, not a link, owned by this user or, with
    ``allow_root``, root; writable by no one else; its SHA-256 the one `record`ed): the
    path to load it by (the descriptor's, where /proc has one) and the descriptor (close it
    after loading). `UntrustedPath` says what failed."""
    try:
        fd = os.open(lib, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise UntrustedPath(
            f"{lib}: cannot open it without following links ({e.strerror})"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPath(f"{lib} is not a regular file")
        if st.st_uid not in _owners(allow_root):
            raise UntrustedPath(f"{lib} is owned by uid {st.st_uid}, not by this user")
        if st.st_mode & 0o022:
            raise UntrustedPath(f"{lib} is writable by group or others")
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        try:
            want = _sidecar(lib).read_text().strip()
        except OSError:
            raise UntrustedPath(f"{lib}: no recorded hash (not built by loraserve here)") from None
        if h.hexdigest() != want:
            raise UntrustedPath(f"{lib}: its SHA-256 is not the one recorded when it was built")
    except BaseException:
        os.close(fd)
        raise
    by_fd = f"/proc/self/fd/{fd}"
    return (by_fd if os.path.exists(by_fd) else str(lib)), fd
