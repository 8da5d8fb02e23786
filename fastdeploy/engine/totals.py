"""Field-by-field sums of statistics dataclasses (one per data-parallel replica behind a server)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import TypeVar

T = TypeVar("T")


def summed_fields(cls: type[T], parts: Iterable[T]) -> T:
    """A `cls` whose every (numeric) field is the sum of that field over `parts`."""
    parts = list(parts)
    return cls(*(sum(getattr(part, field.name) for part in parts) for field in fields(cls)))
