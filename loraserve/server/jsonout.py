"""JSON output as llama-server writes it (`json_dumps`, `JsonResponse`), encoded in short
pieces when it is large.

The standard library's C encoder holds the GIL for a whole `json.dumps` call: a 7 MB answer
(`/tokenize` with pieces of a long text, embeddings of every token) holds it for hundreds of
milliseconds, even from a worker thread, and the event loop (`/health`, every stream)
waits that long. A large value is therefore encoded piece by piece, each piece a C call of at
most about `ATOMS_PER_CALL` values, so the interpreter can hand the GIL over between pieces.
The text is the same, byte for byte, as one call would write.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import JSONResponse  # (FastAPI's is this one)

ATOMS_PER_CALL = 4096  # values (numbers, strings, containers) per C encoder call
_NULL_MEMBER = len(":null}")


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _dumps(obj: Any) -> str:
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"))


def _weight(obj: Any, budget: int = ATOMS_PER_CALL) -> int:
    """About how many values `obj` holds, guessed from its first items (a list's items are
    taken to look like its first one); stops counting past `budget`."""
    if isinstance(obj, list | tuple):
        return 1 + (len(obj) * _weight(obj[0], budget) if obj else 0)
    if isinstance(obj, dict):
        n = 1
        for v in obj.values():
            n += _weight(v, budget)
            if n > budget:
                return n + len(obj)  # large enough: no need to look at the rest
        return n
    return 1


def _pieces(obj: Any, out: list[str]) -> None:
    """Append the JSON text of `obj` to `out`, one encoder call per piece."""
    if _weight(obj) <= ATOMS_PER_CALL:
        out.append(_dumps(obj))
    elif isinstance(obj, dict):
        out.append("{")
        for i, (k, v) in enumerate(obj.items()):
            key = _dumps({k: None})[1:-_NULL_MEMBER]  # the key as json writes it ("1" for 1)
            out.append(f",{key}:" if i else f"{key}:")
            _pieces(v, out)
        out.append("}")
    else:
        per = max(1, ATOMS_PER_CALL // _weight(obj[0]))
        out.append("[")
        for start in range(0, len(obj), per):
            if start:
                out.append(",")
            part = obj[start : start + per]
            if per == 1:
                _pieces(part[0], out)
            else:
                out.append(_dumps(part)[1:-1])
        out.append("]")


def json_dumps(obj: Any) -> str:
    """Compact JSON as llama-server writes it: UTF-8 text, no spaces; NaN/inf become null.
    Large values are encoded in pieces (see the module docstring)."""
    if _weight(obj) <= ATOMS_PER_CALL:
        return _dumps(obj)
    out: list[str] = []
    _pieces(obj, out)
    return "".join(out)


class JsonResponse(JSONResponse):
    """`JSONResponse` writing `json_dumps` (a non-finite float becomes null, not a 500);
    meant as the app's `default_response_class`."""

    def render(self, content: Any) -> bytes:
        return json_dumps(content).encode("utf-8", "replace")
