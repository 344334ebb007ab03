"""Theory results as standard JSON: numpy values as Python ones, non-finite floats as ``null``.

:func:`wbfe.report.json_ready` does the same for plain Python values; the theory results also hold
numpy arrays and scalars, hence this converter, whose output the shared writer then writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["jsonable", "dumps", "write_json"]


def jsonable(obj: Any) -> Any:
    """``obj`` with numpy scalars and arrays as Python values and NaN/±inf as None.

    >>> jsonable({"a": np.array([1.0, np.nan]), "b": (np.int64(2), float("inf"))})
    {'a': [1.0, None], 'b': [2, None]}
    """
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def dumps(data: Any) -> str:
    """Standard JSON text (``allow_nan=False``: a bare NaN can never be written)."""
    return json.dumps(jsonable(data), indent=1, allow_nan=False)


def write_json(data: Any, path: Path) -> Path:
    """Write ``data`` to ``path`` as standard JSON through :func:`wbfe.output.write_json` (atomic)."""
    from wbfe.output import write_json as write

    write(path, jsonable(data), indent=1)
    return path
