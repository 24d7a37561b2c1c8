"""llama.cpp's pooling types (`--pooling`), apart from `embedding` (which pools with torch) so
that the flags parse without torch: the router process never imports it (issue 30)."""

from __future__ import annotations

from enum import StrEnum


class Pooling(StrEnum):
    """llama.cpp's pooling types (`--pooling`), by their flag names."""

    NONE = "none"
    MEAN = "mean"
    CLS = "cls"
    LAST = "last"
    RANK = "rank"

    @classmethod
    def from_gguf(cls, value: object) -> Pooling:
        """The pooling a GGUF's ``{arch}.pooling_type`` names (absent or unknown: none)."""
        order = [cls.NONE, cls.MEAN, cls.CLS, cls.LAST, cls.RANK]
        return order[value] if isinstance(value, int) and 0 <= value < len(order) else cls.NONE

    @property
    def reuses_cache(self) -> bool:
        """Whether a prefix-cache hit is allowed (only the last row is read)."""
        return self in (Pooling.LAST, Pooling.RANK)
