"""The input checks the theory modules share (no imports of theirs, so that any of them can use it)."""

from __future__ import annotations

__all__ = ["is_whole"]


def is_whole(value: object) -> bool:
    """Whether ``value`` is a whole number (3, 3.0, numpy's integers); False for inf, NaN, None, strings, bools."""
    try:
        return not isinstance(value, bool) and int(value) == value  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return False
