"""A one-message chat and the validation error a request schema gives some data (schema tests)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from loraserve.server.errors import (
    validation_message,
)

USER = [{"role": "user", "content": "hi"}]


def error_of(model: type, data: Any) -> str:
    with pytest.raises(ValidationError) as exc:
        model.model_validate(data)
    return validation_message(exc.value.errors())
