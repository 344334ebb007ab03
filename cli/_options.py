"""Choices shared by several commands (one definition, so help texts and values agree)."""

from __future__ import annotations

from enum import Enum


class Format(str, Enum):
    """Output format of commands that print a table or JSON."""

    table = "table"
    json = "json"


class ScoreFormat(str, Enum):
    """Output format of ``wbfe score`` (adds CSV)."""

    table = "table"
    json = "json"
    csv = "csv"


class Conv(str, Enum):
    """Conv-kernel convention (docs/math.md §1)."""

    flatten = "flatten"
    slices = "slices"
