"""The order of a checkpoint's tensors: as stored, unless the writer only sorted them by name (the
``safetensors`` library sorts by dtype, then name), then natural order (``layers.2`` before ``layers.10``)."""

from __future__ import annotations

import re
from typing import Callable, Sequence

__all__ = ["natural_key", "checkpoint_order"]


def natural_key(name: str) -> list[object]:
    """Sort key that orders the numbers inside a name by value: ``a.2`` before ``a.10``."""
    return [int(tok) if tok.isdigit() else tok for tok in re.split(r"(\d+)", name)]


def checkpoint_order(names: Sequence[str], group: Callable[[str], object] = lambda name: None) -> list[str]:
    """``names`` in natural order where the stored order is only the writer's sort by name within each ``group``."""
    runs: dict[object, list[str]] = {}
    for name in names:
        runs.setdefault(group(name), []).append(name)
    in_runs = [name for run in runs.values() for name in run]
    if list(names) == in_runs and all(run == sorted(run) for run in runs.values()):
        return sorted(names, key=natural_key)
    return list(names)
