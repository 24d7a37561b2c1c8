"""The adapter catalogue: every adapter the server may load by name without a load call.

Its entries are the GGUF LoRA files (``NAME.gguf``) and PEFT folders (``NAME/`` holding
``adapter_config.json``) directly inside each ``--lora-dir`` directory, plus the named
paths of ``--lora-modules name=path`` (vLLM's flag). A name is looked up without regard
to case, modules first, then the directories in their order. The directories are read
again when a name is missing (a file copied in after the start is found on its first
use) and at each `list`; nothing is cached but the modules.

An entry must stay inside its directory: a link (or a PEFT file's link) that leads
outside is skipped, as the load endpoints refuse such a path (`inside_dirs`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass(frozen=True)
class Entry:
    """One adapter the catalogue offers: its name, its real path, the base model it says
    it was trained on (PEFT's ``base_model_name_or_path``; a module's ``base_model_name``,
    vLLM's ``parent``), and whether it is a ``--lora-modules`` entry."""

    name: str
    path: Path
    base_model: str | None = None
    module: bool = False


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def inside_dirs(path: str | Path, dirs: Iterable[str]) -> str | None:
    """The directory of ``dirs`` that holds ``path`` once links are resolved (a PEFT
    folder's files included), else None."""
    real = os.path.realpath(path)
    root = next((d for d in dirs if _inside(real, d)), None)
    if root is None:
        return None
    if os.path.isdir(real):
        for f in PEFT_FILES:
            if not _inside(os.path.realpath(os.path.join(real, f)), root):
                return None
    return root


def _base_model(folder: Path) -> str | None:
    try:
        conf = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    name = conf.get("base_model_name_or_path") if isinstance(conf, dict) else None
    return name if isinstance(name, str) else None


def parse_module(text: str) -> tuple[str, str, str | None]:
    """One ``--lora-modules`` value: ``name=path`` or vLLM's JSON form
    ``{"name": ..., "path": ..., "base_model_name": ...}``; ValueError says what is wrong."""
    text = text.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise ValueError(f"invalid JSON {text!r}: {e}") from None
        name, path = obj.get("name"), obj.get("path")
        base = obj.get("base_model_name")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ValueError(f"{text!r}: the JSON form needs string 'name' and 'path'")
        if base is not None and not isinstance(base, str):
            raise ValueError(f"{text!r}: 'base_model_name' must be a string")
        return name, path, base
    name, eq, path = text.partition("=")
    if not eq or not name.strip() or not path.strip():
        raise ValueError(f"{text!r}: expected name=path or a JSON object")
    return name.strip(), path.strip(), None


class Catalogue:
    """Adapters addressable by name: ``dirs`` (absolute, links resolved) and ``modules``
    (name -> (path, base model name or None))."""

    def __init__(
        self,
        dirs: Iterable[str] = (),
        modules: Iterable[tuple[str, str, str | None]] = (),
    ) -> None:
        self.dirs = tuple(os.path.realpath(d) for d in dirs)
        self._modules: dict[str, Entry] = {}
        for name, path, base in modules:
            key = name.casefold()
            if key in self._modules:
                raise ValueError(f"--lora-modules: the name {name!r} is given twice")
            self._modules[key] = Entry(name, Path(path), base, module=True)

    def __bool__(self) -> bool:
        return bool(self.dirs or self._modules)

    def _scan(self, d: str) -> list[Entry]:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            return []
        return [e for n in names if not n.startswith(".") for e in self._scan_one(d, n)]

    def _scan_one(self, d: str, name: str) -> list[Entry]:
        """The entry that file or folder ``name`` of ``d`` makes (``name`` or
        ``name.gguf``), if any."""
        out = []
        for n in (name, f"{name}.gguf") if not name.endswith(".gguf") else (name,):
            p = Path(d) / n
            if p.is_dir() and (p / PEFT_FILES[0]).is_file() and (p / PEFT_FILES[1]).exists():
                if inside_dirs(p, (d,)) is not None:
                    out.append(Entry(n, Path(os.path.realpath(p)), _base_model(p)))
            elif n.endswith(".gguf") and p.is_file() and inside_dirs(p, (d,)) is not None:
                out.append(Entry(n.removesuffix(".gguf"), Path(os.path.realpath(p))))
        return out

    def list(self) -> list[Entry]:
        """Every entry, modules first; a name shadowed by an earlier entry is left out."""
        seen: set[str] = set()
        out = []
        for e in [*self._modules.values(), *(e for d in self.dirs for e in self._scan(d))]:
            if e.name.casefold() not in seen:
                seen.add(e.name.casefold())
                out.append(e)
        return out

    def lookup(self, name: str, scan: bool = True) -> Entry | None:
        """The entry named ``name`` (case ignored), or None. Without ``scan``, only the
        modules and the exact spelling in each directory (no directory listing)."""
        key = name.casefold()
        if key in self._modules:
            return self._modules[key]
        if "/" not in name and "\x00" not in name and name not in (".", ".."):
            for d in self.dirs:  # the exact spelling first: no directory listing
                for e in self._scan_one(d, name):
                    return e
        if not scan:
            return None
        for d in self.dirs:
            for e in self._scan(d):
                if e.name.casefold() == key:
                    return e
        return None
