"""Downloads into the download cache and removals from it, as llama-server does them
(common/hf-cache.cpp, common/download.cpp of the 0.3.36 sdist): the router's `POST /models` and
`DELETE /models`, and `-hf REPO[:TAG]` at start (a repository holding a `preset.ini` starts
the router on those presets).

The hub protocol is llama.cpp's, against `$MODEL_ENDPOINT` (else `$HF_ENDPOINT`, else
huggingface.co): `GET api/models/REPO/refs` (the `main` branch's commit, else the first
valid one), `GET api/models/REPO/tree/COMMIT?recursive=true` (the files), `GET
REPO/resolve/COMMIT/PATH` (a file). Files land as the Hugging Face cache lays them out
(`blobs/OID`, `snapshots/COMMIT/PATH` a relative link to it, `refs/main`), where `hf_cache`
reads them. The choice of file is llama.cpp's: `preset.ini` at the root if there is one, else
the file of `-hff`, else the tag's model (no tag: Q4_K_M, else Q8_0, else the first), with
its other shards. A small client of our own: llama-server's requests, its cache layout and
its progress events, with a cancel checked between chunks.

**Ours:** `remove` deletes only what lies inside the repository's cache folder (llama.cpp
also deletes the target of a snapshot link pointing anywhere).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraserve.server.router.hf_cache import _REPO, best_model, cache_dir, split_info

TIMEOUT_S = 30.0  # per request (connection and each read)
CHUNK = 1 << 20
PROGRESS_S = 0.1  # llama-server's throttle between progress events
_SHARD = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})\.gguf$", re.IGNORECASE)
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")

Progress = Callable[[str, int, int], None]  # (url, bytes done, bytes in all; 0: unknown)


class HubError(Exception):
    """The hub could not give what was asked: `status` 404 (no such repository or file) or
    503 (not reachable, or an answer that is not the hub's)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Cancelled(Exception):
    """The download was cancelled (its partial file is gone)."""


@dataclass(frozen=True)
class HubFile:
    path: str  # in the repository
    oid: str  # content id ("" when the hub gives none: stored under its path)


@dataclass(frozen=True)
class Plan:
    """What a download fetches: `files` of `repo` at `commit` (`preset`: the one
    `preset.ini`); `final` is the path of the first one in the cache."""

    repo: str
    commit: str
    files: tuple[HubFile, ...]
    preset: bool = False

    @property
    def folder(self) -> Path:
        root = cache_dir()
        if root is None:
            raise HubError(503, "no download cache folder (set LLAMA_CACHE or HOME)")
        return root / ("models--" + self.repo.replace("/", "--"))

    def final(self, f: HubFile) -> Path:
        return self.folder / "snapshots" / self.commit / f.path

    def url(self, f: HubFile) -> str:
        return f"{endpoint()}{self.repo}/resolve/{self.commit}/{urllib.parse.quote(f.path)}"


def endpoint() -> str:
    """The hub's base URL, ending in '/' (llama.cpp's `common_get_model_endpoint`)."""
    url = os.environ.get("MODEL_ENDPOINT") or os.environ.get("HF_ENDPOINT") or ""
    url = url or "https://huggingface.co/"
    return url if url.endswith("/") else url + "/"


def split_repo_tag(name: str) -> tuple[str, str]:
    """(`ORG/NAME`, TAG) of `ORG/NAME[:TAG]`; ValueError naming the expected form."""
    repo, _, tag = name.partition(":")
    if not _REPO.fullmatch(repo) or repo.count("/") != 1 or len(repo) > 256 or ":" in tag:
        raise ValueError(f"invalid HF repo format {name!r}, expected <user>/<model>[:quant]")
    return repo, tag


def _get_json(url: str, token: str) -> Any:
    headers = {"Accept": "application/json", "User-Agent": "loraserve"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        req = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return json.loads(r.read(16 << 20))
    except urllib.error.HTTPError as e:
        raise HubError(404 if e.code in (401, 404) else 503, f"{url}: HTTP {e.code}") from None
    except (OSError, ValueError) as e:  # unreachable, timed out, not JSON
        raise HubError(503, f"{url}: {e}") from None


def _safe_path(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and ".." not in parts and "" not in parts


def repo_files(repo: str, token: str = "") -> tuple[str, list[HubFile]]:
    """(commit, files) of `repo` on the hub (paths that would leave the snapshot, and
    invalid ids, skipped as llama.cpp skips them)."""
    base = f"{endpoint()}api/models/{repo}"
    refs = _get_json(f"{base}/refs", token)
    listed = refs.get("branches") if isinstance(refs, dict) else None
    branches = [
        b
        for b in (listed if isinstance(listed, list) else [])
        if isinstance(b, dict) and _COMMIT.fullmatch(str(b.get("targetCommit")))
    ]
    if not branches:
        raise HubError(404, f"{repo}: the hub names no branch with a valid commit")
    commit = str(
        next((b for b in branches if b.get("name") == "main"), branches[0])["targetCommit"]
    )
    tree = _get_json(f"{base}/tree/{commit}?recursive=true", token)
    if not isinstance(tree, list):
        raise HubError(503, f"{repo}: the hub's file list is not a list")
    files = []
    for item in tree:
        if not isinstance(item, dict) or item.get("type") != "file":
            continue
        path, lfs = item.get("path"), item.get("lfs")
        oid = lfs.get("oid") if isinstance(lfs, dict) else item.get("oid")
        oid = oid if isinstance(oid, str) else ""
        if isinstance(path, str) and _safe_path(path) and (not oid or _HEX.fullmatch(oid)):
            files.append(HubFile(path, oid))
    return commit, files


def plan(name: str, hf_file: str = "", token: str = "") -> Plan:
    """What `-hf NAME` / `POST /models {"model": NAME}` fetches (ValueError: a bad name;
    HubError: the hub cannot say, or has no such model)."""
    repo, tag = split_repo_tag(name)
    commit, files = repo_files(repo, token)
    by_path = {f.path: f for f in files}
    if "preset.ini" in by_path:
        return Plan(repo, commit, (by_path["preset.ini"],), preset=True)
    if hf_file:
        if hf_file not in by_path:
            raise HubError(404, f"{repo} has no file {hf_file!r}")
        primary = hf_file
    else:
        found = best_model([f.path for f in files], tag)
        if found is None:
            what = f"with tag {tag}" if tag else "of a model"
            raise HubError(404, f"{repo} has no GGUF file {what}")
        primary = found
    shard = _SHARD.match(primary)
    if shard is None:
        return Plan(repo, commit, (by_path[primary],))
    prefix, count = shard.group(1), shard.group(3)
    parts = [f"{prefix}-{i:05d}-of-{count}.gguf" for i in range(1, int(count) + 1)]
    missing = [p for p in parts if p not in by_path]
    if missing:
        raise HubError(404, f"{repo}: shard {missing[0]} of {primary} is not on the hub")
    return Plan(repo, commit, tuple(by_path[p] for p in parts))


def fetch(
    p: Plan, progress: Progress | None = None, cancelled: Callable[[], bool] = lambda: False
) -> Path:
    """Download `p`'s files that are not in the cache yet (blocking); the first one's path.
    HubError when one cannot be fetched, Cancelled when `cancelled()` turns true."""
    folder = p.folder
    for f in p.files:
        final = p.final(f)
        if final.exists():
            continue
        blob = folder / "blobs" / f.oid if f.oid else final
        if not blob.exists():
            _pull(p.url(f), blob, progress, cancelled)
        if blob != final:
            final.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # made meanwhile by another fetch
                final.symlink_to(os.path.relpath(blob, final.parent))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(p.commit)
    return p.final(p.files[0])


def _pull(url: str, dest: Path, progress: Progress | None, cancelled: Callable[[], bool]) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    # its own partial file: two fetches of one blob at once (a preset's load and a `POST
    # /models`) each write theirs, and the first whole one is renamed into place
    part = dest.with_name(f"{dest.name}.downloadInProgress.{os.getpid()}.{threading.get_ident()}")
    done, total, last = 0, 0, 0.0
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "loraserve"})
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r, open(part, "wb") as out:
            total = int(r.headers.get("Content-Length") or 0)
            if progress:
                progress(url, 0, total)
            while chunk := r.read(CHUNK):
                if cancelled():
                    raise Cancelled(url)
                out.write(chunk)
                done += len(chunk)
                if progress and time.monotonic() - last >= PROGRESS_S:
                    progress(url, done, total)
                    last = time.monotonic()
        if total and done != total:
            raise HubError(503, f"{url}: {done} of {total} bytes arrived")
        part.replace(dest)
    except urllib.error.HTTPError as e:
        raise HubError(404 if e.code == 404 else 503, f"{url}: HTTP {e.code}") from None
    except OSError as e:
        raise HubError(503, f"{url}: {e}") from None
    finally:
        part.unlink(missing_ok=True)
    if progress:
        progress(url, done, total or done)


def remove(name: str) -> bool:
    """Delete `ORG/NAME:TAG`'s files from the cache (no tag: the whole repository), and the
    blobs no other snapshot file uses (llama.cpp's `common_download_remove`); whether there
    was anything to delete. Only paths inside the repository's folder are touched."""
    repo, tag = split_repo_tag(name)
    root = cache_dir()
    if root is None:
        return False
    folder = (root / ("models--" + repo.replace("/", "--"))).resolve()
    if not tag:
        existed = folder.is_dir()
        shutil.rmtree(folder, ignore_errors=True)
        return existed
    snapshots = [s for s in (folder / "snapshots").glob("*") if s.is_dir()]
    entries = [
        e
        for s in snapshots
        for e in s.rglob("*.gguf")
        if (info := split_info(e.relative_to(s).as_posix())) and info[1] == tag.upper()
    ]
    blobs = {_inside(e, folder) for e in entries if e.is_symlink()} - {None}
    for e in entries:
        e.unlink(missing_ok=True)
    used = {_inside(e, folder) for s in snapshots for e in s.rglob("*") if e.is_symlink()}
    for blob in blobs - used:
        assert blob is not None
        blob.unlink(missing_ok=True)
    return bool(entries)


def _inside(link: Path, folder: Path) -> Path | None:
    """The file `link` points to when it lies inside `folder` (None: elsewhere)."""
    target = (link.parent / os.readlink(link)).resolve()
    return target if target.is_relative_to(folder) else None


def resolve_arg(name: str, hf_file: str = "", offline: bool = False) -> tuple[str, str]:
    """`-hf NAME` (`-hff FILE`) at start: ("model", path) or ("preset", path of the
    repository's preset.ini), downloaded first unless `offline` or the hub cannot be reached
    (then the cache's copy, as llama-server). ValueError saying why there is none."""
    from loraserve.server.router.hf_cache import resolve, resolve_preset

    repo, _ = split_repo_tag(name)
    why = "--offline"
    if not offline:
        try:
            p = plan(name, hf_file, os.environ.get("HF_TOKEN", ""))
            return ("preset" if p.preset else "model"), str(fetch(p))
        except (HubError, OSError) as e:  # OSError: the cache cannot be written
            why = str(e)
    preset = resolve_preset(repo)
    if preset is not None:
        return "preset", preset
    path = resolve(name, hf_file)
    if path is None:
        shown = " ".join(filter(None, (name, hf_file)))
        raise ValueError(
            f"{shown} is not in the download cache ({cache_dir()}) and was not downloaded ({why})"
        )
    return "model", path
