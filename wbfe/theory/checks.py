"""The input checks the theory modules share (no imports of theirs, so that any of them can use it)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from wbfe.errors import InvalidOptionError

__all__ = ["MAX_BYTES", "is_whole", "is_number", "finite_number", "check_bytes"]

MAX_BYTES = 4 * 2**30  # the largest array a simulation allocates


def is_whole(value: object) -> bool:
    """Whether ``value`` is a whole number (3, 3.0, numpy's integers); False for inf, NaN, None, strings, bools."""
    try:
        return not isinstance(value, bool) and int(value) == value  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return False


def is_number(value: Any, kind: type = numbers.Real) -> bool:
    """Whether ``value`` is a number of ``kind`` (NumPy's included: numbers' ABCs, numpy not imported); never a bool."""
    return isinstance(value, kind) and not isinstance(value, bool)


def finite_number(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def check_bytes(floats: int, what: str, fix: str) -> None:
    """Refuse, before allocating, ``floats`` float64 values over :data:`MAX_BYTES` (a MemoryError after minutes)."""
    if floats * 8 > MAX_BYTES:
        raise InvalidOptionError(f"{what} need {floats * 8 / 2**30:.1f} GiB (limit {MAX_BYTES / 2**30:.0f} GiB); {fix}")
