"""The models of the download cache, as llama-server's router lists them (common/hf-cache.cpp
`get_cached_files`, common/download.cpp `common_list_cached_models`): a Hugging Face hub cache
(`models--ORG--NAME/refs/main` naming a commit, `snapshots/COMMIT/**.gguf`), found in the
first of `$LLAMA_CACHE`, `$HF_HUB_CACHE`, `$HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`,
`$XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub`. Each model is `ORG/NAME:TAG`
(the tag: the file name's last `-` or `.` separated part, upper-cased, `Q4_K_M` in
`gemma-Q4_K_M.gguf`), from the first shard of a split file; projectors (`mmproj`) and draft
heads (`mtp-`, `eagle3-`, `dflash-`, `dspark-`) are left out.

`resolve` finds the file of `-hf REPO[:TAG]` (and `-hff FILE`) in the cache as llama-server
does offline (`common_download_resolve_path`: the tag's file, else Q4_K_M, else Q8_0, else the
first model); `dedup_hidden` is the router's `dedup-cache-models`: cache entries whose file a
preset with that key already serves (as its `hf-repo` or `spec-draft-hf`) are not listed.

`pending_hf` finds a preset whose `-hf` model is not in the cache yet: **ours**, as llama-server's
child downloads it when it starts, `router.pending` downloads it when the preset is loaded.

`router.download` fills the cache (`POST /models`, `-hf` at start) and removes from it
(`DELETE /models`); what is in it is served by its id, as any file.
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


def _snapshots(root: Path | None, only: str | None = None) -> dict[str, Path]:
    """Repository id -> the snapshot folder its ref names."""
    root = cache_dir() if root is None else root
    out: dict[str, Path] = {}
    if root is None or not root.is_dir():
        return out
    for repo in sorted(root.iterdir()):
        repo_id = _repo_id(repo.name)
        if repo_id is None or (only is not None and repo_id != only) or not repo.is_dir():
            continue
        commit = _commit(repo)
        snapshot = repo / "snapshots" / commit if commit else None
        if snapshot is not None and snapshot.is_dir():
            out[repo_id] = snapshot
    return out


def _repos(root: Path | None, only: str | None = None) -> dict[str, list[tuple[str, Path]]]:
    """Repository id -> its snapshot's GGUF files (path in the repository, local path)."""
    out: dict[str, list[tuple[str, Path]]] = {}
    for repo_id, snapshot in _snapshots(root, only).items():
        files = out.setdefault(repo_id, [])
        for n, path in enumerate(sorted(snapshot.rglob("*.gguf"))):
            if n >= MAX_FILES:
                break
            if path.is_file():
                files.append((path.relative_to(snapshot).as_posix(), path))
    return out


def _is_model(info: tuple[str, str, int] | None) -> bool:
    return info is not None and not any(s in info[0] for s in _SKIPPED)


def cached_models(root: Path | None = None) -> dict[str, str]:
    """`ORG/NAME:TAG` -> the file to load (its first shard), for every model in the cache."""
    out: dict[str, str] = {}
    for repo_id, files in _repos(root).items():
        for name, path in files:
            info = split_info(name)
            if _is_model(info) and info is not None and info[2] == 1 and info[1]:
                out.setdefault(f"{repo_id}:{info[1]}", str(path))
    return out


def best_model(paths: list[str], tag: str) -> str | None:
    """llama.cpp's `find_best_model` over a repository's file paths: the first model (first
    shard) with `TAG` followed by `.` or `-` in its path (no tag: Q4_K_M, else Q8_0, else the
    first model)."""
    models = [n for n in paths if _is_model(info := split_info(n)) and info[2] == 1]
    for t in [tag] if tag else ["Q4_K_M", "Q8_0"]:
        pattern = re.compile(re.escape(t) + "[.-]", re.IGNORECASE)
        for name in models:
            if pattern.search(name):
                return name
    return models[0] if models and not tag else None


def resolve(repo_tag: str, hf_file: str = "", root: Path | None = None) -> str | None:
    """The cached file of `-hf REPO[:TAG]` (`-hff FILE`: that file), None if not cached."""
    repo_id, _, tag = repo_tag.partition(":")
    files = dict(_repos(root, repo_id).get(repo_id, []))
    if hf_file:
        return str(files[hf_file]) if hf_file in files else None
    name = best_model(list(files), tag)
    return None if name is None else str(files[name])


def resolve_preset(repo_id: str, root: Path | None = None) -> str | None:
    """The cached `preset.ini` at the root of `repo_id`'s snapshot (a preset repository, which
    `-hf` starts the router on), None if there is none."""
    for snapshot in _snapshots(root, repo_id).values():
        path = snapshot / "preset.ini"
        if path.is_file():
            return str(path)
    return None


_HF_FLAGS = {"-hf": "repo", "-hfr": "repo", "--hf-repo": "repo"}
_HF_FLAGS |= {"-hff": "file", "--hf-file": "file"}


def pending_hf(argv: list[str]) -> tuple[str, str, list[str]] | None:
    """A preset's `-hf REPO[:TAG]` (`-hff FILE`) when the cache has no such file: (REPO[:TAG],
    FILE, its other flags); None when its flags name no repository, a malformed one (listing
    names why) or one the cache holds. `argv`: flags and values as separate words."""
    found, rest = {"repo": "", "file": ""}, []
    words = iter(argv)
    for word in words:
        kind = _HF_FLAGS.get(word)
        if kind is None:
            rest.append(word)
        else:
            found[kind] = next(words, "")
    repo, _, tag = found["repo"].partition(":")
    if not _REPO.fullmatch(repo) or repo.count("/") != 1 or ":" in tag:
        return None
    return None if resolve(found["repo"], found["file"]) else (found["repo"], found["file"], rest)


_HF_KEYS = {  # INI keys of a preset's cached files (their flag and environment spellings)
    "repo": ("hf-repo", "hf", "hfr", "LLAMA_ARG_HF_REPO"),
    "file": ("hf-file", "hff", "LLAMA_ARG_HF_FILE"),
    "draft": ("spec-draft-hf", "hfd", "hfrd", "hf-repo-draft", "LLAMA_ARG_SPEC_DRAFT_HF_REPO"),
}


def dedup_hidden(keys: list[dict[str, str]], cache: dict[str, str]) -> set[str]:
    """The cache ids (of `cache`: id -> file) whose file one of the presets `keys` (merged
    INI keys) with `dedup-cache-models` true serves as its model or draft model."""

    def first(merged: dict[str, str], kind: str) -> str:
        return next((merged[k] for k in _HF_KEYS[kind] if merged.get(k)), "")

    served = set()
    for merged in keys:
        if merged.get("dedup-cache-models", "").lower() not in ("1", "true", "on", "yes"):
            continue
        for repo, file in (
            (first(merged, "repo"), first(merged, "file")),
            (first(merged, "draft"), ""),
        ):
            path = resolve(repo, file) if repo else None
            if path is not None:
                served.add(path)
    return {name for name, path in cache.items() if path in served}
