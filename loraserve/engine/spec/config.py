"""`SpecConfig`: the speculative-decoding settings, with llama-server's names and defaults
(common/common.h and common/arg.cpp of the llama.cpp in the llama-cpp-python 0.3.36 sdist),
and `SpecRequest`, a request's own `speculative.n_max/n_min/p_min`."""

from __future__ import annotations

from dataclasses import dataclass

# every name llama-server's --spec-type knows, in its order (common_speculative_type)
ALL_TYPES = (
    "none",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)
SUPPORTED_TYPES = ("ngram-simple", "ngram-mod", "draft-simple")  # in llama.cpp's priority


def parse_types(value: str) -> tuple[str, ...]:
    """`--spec-type`'s comma-separated list -> the types in llama.cpp's priority order (a
    sequence takes the longest of its n-gram types' drafts, the first on a tie, and the
    draft model's only where no n-gram type drafts), `none` anywhere: none.

    ValueError names an unknown type (as llama-server) or one loraserve does not implement.
    """
    types: list[str] = []
    for raw in value.split(","):
        name = raw.strip()
        if name not in ALL_TYPES:
            raise ValueError(f"unknown speculative type: {name}")
        if name == "none":
            return ()
        if name not in SUPPORTED_TYPES:
            raise ValueError(
                f"speculative type {name} is not supported by loraserve "
                f"(supported: {', '.join(SUPPORTED_TYPES)})"
            )
        types.append(name)
    return tuple(t for t in SUPPORTED_TYPES if t in types)


@dataclass(frozen=True)
class SpecConfig:
    """Server-wide speculative decoding (``types`` empty: off). Field names follow the flags:
    ``draft_*`` are `--spec-draft-*` (draft models, and the request fields' defaults),
    ``ngram_simple_*`` `--spec-ngram-simple-*`, ``ngram_mod_*`` `--spec-ngram-mod-*`."""

    types: tuple[str, ...] = ()
    draft_model: str | None = None  # -md: a GGUF with the target's vocabulary
    draft_n_max: int = 3
    draft_n_min: int = 0
    draft_p_min: float = 0.0
    ngram_simple_size_n: int = 12
    ngram_simple_size_m: int = 48
    ngram_simple_min_hits: int = 1
    ngram_mod_n_match: int = 24
    ngram_mod_n_min: int = 48
    ngram_mod_n_max: int = 64
    adaptive: bool = True  # back off where drafts are rejected or the batch is large

    @property
    def enabled(self) -> bool:
        return bool(self.types)

    def type_n_max(self, kind: str) -> int:
        """The longest draft a type proposes (llama.cpp's `common_speculative_n_max`)."""
        if kind == "ngram-simple":
            return self.ngram_simple_size_m
        if kind == "ngram-mod":
            return self.ngram_mod_n_max
        return self.draft_n_max


@dataclass(frozen=True)
class SpecRequest:
    """A request's `speculative.*` fields: None keeps the server's value. ``n_max`` caps
    every type's draft, ``n_min`` drops shorter drafts, ``p_min`` is the draft model's
    greedy probability floor; ``n_max`` 0 turns speculation off for the request."""

    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None

    def validate(self) -> None:
        """Raise ValueError naming the field."""
        for name in ("n_max", "n_min"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"speculative.{name} must be an integer >= 0, got {v!r}")
        p = self.p_min
        if p is not None and (
            isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0
        ):
            raise ValueError(f"speculative.p_min must be a number in [0, 1], got {p!r}")
