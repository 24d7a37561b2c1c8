"""One adapter target's low-rank pair in memory (`LoraWeight`): float32 A and B, or the
file's float16 halves alone, which the kernels read (`kernels.lora16`) with the float32
route's bits; the widening to float32 is exact, so either form gives the same values."""

from __future__ import annotations

import torch

from loraserve.kernels.lora16 import untile


class LoraWeight:
    """One target's low-rank pair; ``factor`` multiplies the user scale. A pair the file
    stored as halves (2-D targets, with the compiled kernels) is held as halves alone:
    ``a16`` [r, in], ``bt16`` (B in 8-output tiles, `kernels.lora16.tiles`) and ``tail16``
    (B's rows past the last whole tile), which the kernels read, half the bytes, the same
    bits; ``a`` and ``b`` then widen them on each use (exact: one float32 per half)."""

    __slots__ = ("_a", "_b", "factor", "a16", "bt16", "tail16")

    def __init__(
        self,
        a: torch.Tensor | None,  # [r, in] or [E, r, in] float32; None: halves alone
        b: torch.Tensor | None,  # [out, r] or [E, out, r] float32; None: halves alone
        factor: float,
        a16: torch.Tensor | None = None,  # [r, in] float16
        bt16: torch.Tensor | None = None,  # [out // 8, r, 8] float16
        tail16: torch.Tensor | None = None,  # [out % 8, r] float16
    ) -> None:
        if (a is None or b is None) and (a16 is None or bt16 is None or tail16 is None):
            raise ValueError("a LoRA pair needs float32 A and B or all of its halves")
        self._a, self._b, self.factor = a, b, factor
        self.a16, self.bt16, self.tail16 = a16, bt16, tail16

    @property
    def a(self) -> torch.Tensor:
        """A as float32 [r, in] (widened from the halves when only they are held)."""
        if self._a is not None:
            return self._a
        assert self.a16 is not None
        return self.a16.float()

    @property
    def b(self) -> torch.Tensor:
        """B as float32 [out, r] (widened from the halves when only they are held)."""
        if self._b is not None:
            return self._b
        return self.b16().float()

    def b16(self) -> torch.Tensor:
        """B [out, r] as float16 (only for a pair with halves)."""
        assert self.bt16 is not None and self.tail16 is not None
        return untile(self.bt16, self.tail16)

    @property
    def halves_only(self) -> bool:
        """Whether the pair is held as its halves alone (no float32 copy)."""
        return self._a is None

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors held in memory."""
        held = (self._a, self._b, self.a16, self.bt16, self.tail16)
        return tuple(t for t in held if t is not None)

    @property
    def nbytes(self) -> int:  # bytes in memory
        return sum(t.nbytes for t in self.tensors)

    @property
    def a_shape(self) -> tuple[int, ...]:
        return tuple((self._a if self._a is not None else self.a16).shape)  # type: ignore[union-attr]

    @property
    def b_shape(self) -> tuple[int, ...]:
        if self._b is not None:
            return tuple(self._b.shape)
        assert self.bt16 is not None and self.tail16 is not None
        return (self.bt16.shape[0] * 8 + self.tail16.shape[0], self.bt16.shape[1])

    @property
    def rank(self) -> int:
        return self.a_shape[-2]
