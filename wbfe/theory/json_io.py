"""Theory results as standard JSON: numpy values as Python ones, non-finite floats as ``null``.

:func:`jsonable` is :func:`wbfe.render.text.json_ready` (numpy arrays and scalars as Python values, NaN/±inf as
``null``), kept under this name for the theory modules that import it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wbfe.render.text import json_ready

__all__ = ["jsonable", "dumps", "write_json"]


jsonable = json_ready  # one converter for every JSON wbfe writes (numpy values, non-finite -> null)


def dumps(data: Any) -> str:
    """Standard JSON text (``allow_nan=False``: a bare NaN can never be written)."""
    return json.dumps(jsonable(data), indent=1, allow_nan=False)


def write_json(data: Any, path: Path) -> Path:
    """Write ``data`` to ``path`` as standard JSON through :func:`wbfe.render.files.write_json` (atomic)."""
    from wbfe.render.files import write_json as write

    write(path, jsonable(data), indent=1)
    return path
