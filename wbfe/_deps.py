"""torch, which the base install leaves out (docs/install.md): the paths that need it call
:func:`require_torch` (one typed error naming what needed it); those it only helps ask
:func:`torch_installed` and go on without it.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Optional

from wbfe.errors import MissingDependencyError

__all__ = ["TORCH_INSTALL", "loaded", "require", "require_torch", "torch_installed"]

TORCH_INSTALL = "pip install 'wbfe[torch]'"


def require(package: str, message: str) -> ModuleType:
    """``package``, imported; MissingDependencyError with ``message`` without it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise MissingDependencyError(message, package=package) from None


def require_torch(what: str) -> ModuleType:
    """torch, imported; MissingDependencyError naming ``what`` (``"reading a PyTorch pickle"``) without it."""
    return require("torch", f"{what} needs torch: {TORCH_INSTALL}")


def torch_installed() -> bool:
    """Whether torch can be imported, asked without importing it (which takes seconds)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a torch entry of None or without a spec in sys.modules
        return False


def loaded(name: str) -> Optional[ModuleType]:
    """The module ``name`` if this process has finished importing it; else None (not imported, blocked,
    or still being imported by a thread).

    A module enters ``sys.modules`` when its import starts: read there while a pipeline thread imported
    torch, it had no ``Tensor`` yet (issue 45 §12). ``_initializing`` is the flag CPython's import waits on.
    """
    module = sys.modules.get(name)
    return None if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False) else module
