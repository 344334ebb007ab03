"""Theory results as standard JSON: numpy values as Python ones, non-finite floats as ``null``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from wbfe.render.text import json_ready

__all__ = ["dumps", "fields_dict"]


def fields_dict(obj: Any) -> dict[str, Any]:
    """A result dataclass's fields in order, arrays and tuples as lists; non-finite floats stay floats (for
    tables), :func:`~wbfe.render.text.json_ready` writes them as ``null``."""
    out = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return {name: value.tolist() if isinstance(value, np.ndarray) else list(value) if isinstance(value, tuple)
            else dict(value) if isinstance(value, dict) else value for name, value in out.items()}


def dumps(data: Any) -> str:
    """Standard JSON text (``allow_nan=False``: a bare NaN can never be written)."""
    return json.dumps(json_ready(data), indent=1, allow_nan=False)

