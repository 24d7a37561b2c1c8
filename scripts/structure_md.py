"""Regenerate docs/structure.md: one line per module, from each module's docstring."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = """# Code map

One line per module (from its docstring; regenerate with `python scripts/structure_md.py`).
Data flow: `server/` parses and validates HTTP and calls the `Engine`'s public methods only;
`Engine.submit` fixes each request's adapter mix and cache key at receipt, and the engine
thread schedules slots over `cache/`, runs `model/` with `lora/` deltas in one forward per
step, samples, and streams events back. The request path, owners and invariants:
`docs/architecture.md`.
"""


def first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split()) if doc else ""


def main() -> None:
    lines = [HEADER]
    for folder in ("loraserve", "tests", "bench", "scripts"):
        files = sorted((ROOT / folder).rglob("*.py"))
        if not files:
            continue
        lines.append(f"\n## {folder}/\n")
        for f in files:
            rel = f.relative_to(ROOT)
            lines.append(f"- `{rel}`: {first_line(f)}")
    (ROOT / "docs" / "structure.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
