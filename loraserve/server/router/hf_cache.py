"""The models of the download cache, as llama-server's router lists them (common/hf-cache.cpp
`get_cached_files`, common/download.cpp `common_list_cached_models`): a Hugging Face hub cache
(`models--ORG--NAME/refs/main` naming a commit, `snapshots/COMMIT/**.gguf`), found in the
first of `$LLAMA_CACHE`, `$HF_HUB_CACHE`, `$HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`,
`$XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub`. Each model is `ORG/NAME:TAG`
(the tag: the file name's last `-` or `.` separated part, upper-cased, `Q4_K_M` in
`gemma-Q4_K_M.gguf`), from the first shard of a split file; projectors (`mmproj`) and draft
heads (`mtp-`, `eagle3-`, `dflash-`, `dspark-`) are left out.

loraserve downloads nothing: what is in the cache is served, by that name, as any file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_COMMIT = re.compile(r"[0-9a-fA-F]{40}")
_REPO = re.compile(r"[A-Za-z0-9_]+(?:[/.-][A-Za-z0-9_]+)*")
_SKIPPED = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")  # anywhere in the prefix
MAX_FILES = 10_000  # files looked at per snapshot (a cache is the user's, but bounded)


def cache_dir() -> Path | None:
    """The cache folder llama-server would read (None when no variable or home is set)."""
    home = os.environ.get("HOME")
    for var, sub in (
        ("LLAMA_CACHE", ""),
        ("HF_HUB_CACHE", ""),
        ("HUGGINGFACE_HUB_CACHE", ""),
        ("HF_HOME", "hub"),
        ("XDG_CACHE_HOME", "huggingface/hub"),
    ):
        value = os.environ.get(var)
        if value:
            return Path(value) / sub if sub else Path(value)
    return Path(home) / ".cache" / "huggingface" / "hub" if home else None


def split_info(path: str) -> tuple[str, str, int] | None:
    """(prefix, TAG, shard index) of a `.gguf` path, as llama.cpp's `get_gguf_split_info`."""
    if not path.endswith(".gguf"):
        return None
    prefix, index = path[: -len(".gguf")], 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index = m.group(1), int(m.group(2))
    tag = _TAG.search(prefix)
    return prefix, tag.group(1).upper() if tag else "", index


def _repo_id(folder: str) -> str | None:
    if not folder.startswith("models--"):
        return None
    repo = folder[len("models--") :].replace("--", "/")
    ok = len(repo) <= 256 and repo.count("/") == 1 and _REPO.fullmatch(repo)
    return repo if ok else None


def _commit(repo: Path) -> str | None:
    """The commit `refs/main` names, else the first valid ref's."""
    refs = repo / "refs"
    if not refs.is_dir():
        return None
    found = None
    for ref in sorted(refs.iterdir()):
        try:
            lines = ref.read_text(errors="replace").splitlines() if ref.is_file() else []
        except OSError:
            continue
        commit = lines[0].strip() if lines else ""
        if _COMMIT.fullmatch(commit):
            if ref.name == "main":
                return commit
            found = found or commit
    return found


def cached_models(root: Path | None = None) -> dict[str, str]:
    """`ORG/NAME:TAG` -> the file to load (its first shard), for every model in the cache."""
    root = cache_dir() if root is None else root
    out: dict[str, str] = {}
    if root is None or not root.is_dir():
        return out
    for repo in sorted(root.iterdir()):
        repo_id = _repo_id(repo.name)
        commit = _commit(repo) if repo_id and repo.is_dir() else None
        snapshot = repo / "snapshots" / commit if commit else None
        if repo_id is None or snapshot is None or not snapshot.is_dir():
            continue
        files = []
        for n, path in enumerate(sorted(snapshot.rglob("*.gguf"))):
            if n >= MAX_FILES:
                break
            files.append(path)
        for path in files:
            info = split_info(path.relative_to(snapshot).as_posix())
            if info is None or (not path.is_file()):
                continue
            prefix, tag, index = info
            if index != 1 or not tag or any(s in prefix for s in _SKIPPED):
                continue
            out.setdefault(f"{repo_id}:{tag}", str(path))
    return out
