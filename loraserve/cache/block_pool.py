"""Block ids and their reference counts over the preallocated KV pool.

Invariants (checked by `check`):
- a block is in exactly one state: free (in ``_free``), or used (refcount >= 0 and
  either referenced by sequences or held by the prefix index);
- ``refcount[b] > 0`` only for used blocks; the pool never hands out a used block.
The pool knows nothing about tokens or adapters; the prefix cache does.
"""

from __future__ import annotations


class OutOfBlocks(RuntimeError):
    """No free block is left and nothing more can be evicted."""


class BlockPool:
    """Allocator of fixed-size KV blocks; capacity may grow up to ``max_blocks``."""

    def __init__(self, block_size: int, max_blocks: int, initial_blocks: int = 0) -> None:
        if block_size <= 0 or max_blocks <= 0:
            raise ValueError("block_size and max_blocks must be positive")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.capacity = 0
        self.refcount: list[int] = []
        self._free: list[int] = []
        self._used: set[int] = set()
        self.grow(min(max(initial_blocks, 1), max_blocks))

    def grow(self, capacity: int) -> None:
        """Raise capacity (the runner resizes its KV tensors to match before a step)."""
        capacity = min(capacity, self.max_blocks)
        if capacity <= self.capacity:
            return
        new = list(range(self.capacity, capacity))
        self.refcount.extend([0] * len(new))
        self._free.extend(reversed(new))
        self.capacity = capacity

    @property
    def num_free(self) -> int:
        return len(self._free) + (self.max_blocks - self.capacity)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def allocate(self) -> int:
        """Take one free block with refcount 1."""
        if not self._free:
            if self.capacity >= self.max_blocks:
                raise OutOfBlocks("KV pool exhausted")
            self.grow(max(self.capacity * 2, self.capacity + 16))
        b = self._free.pop()
        self._used.add(b)
        self.refcount[b] = 1
        return b

    def incref(self, b: int) -> None:
        assert b in self._used, f"incref of free block {b}"
        self.refcount[b] += 1

    def decref(self, b: int) -> int:
        """Drop one reference; returns the new count (the block stays used at 0)."""
        assert self.refcount[b] > 0, f"decref of unreferenced block {b}"
        self.refcount[b] -= 1
        return self.refcount[b]

    def free(self, b: int) -> None:
        """Return an unreferenced block to the free list."""
        assert self.refcount[b] == 0 and b in self._used, f"free of busy block {b}"
        self._used.discard(b)
        self._free.append(b)

    def check(self) -> None:
        """Assert the pool's invariants (used by tests)."""
        free = set(self._free)
        assert len(free) == len(self._free), "block freed twice"
        assert not (free & self._used), "block both free and used"
        assert free | self._used == set(range(self.capacity)), "block lost"
        assert all(self.refcount[b] == 0 for b in free)
