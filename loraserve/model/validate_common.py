"""What every check of a model file shares: the error it raises, the bounds on sizes, and the
small tests and renderings of metadata values its messages use."""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_WIDTH = 1 << 20  # hidden size, head dim, FFN width, head counts
MAX_LAYERS = 4096
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 4096
MAX_CONTEXT = 1 << 24


class ModelFileError(ValueError):
    """A model file that cannot be served; the message names the file and the problem."""


def is_int(v: Any) -> bool:
    """An integer metadata value (numpy integers too), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def show_value(v: Any) -> str:
    """A metadata value in a message, bounded."""
    s = repr(v.tolist() if isinstance(v, np.ndarray) else v)
    return s if len(s) <= 60 else s[:57] + "..."
