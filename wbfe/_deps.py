"""torch, which the base install leaves out: the one place that says it is missing.

A float safetensors, GGUF, Keras, ONNX, TFLite, Flax or NumPy checkpoint is scored on the CPU
with numpy alone, so torch is an extra (``pip install 'wbfe[torch]'``). The paths that cannot
work without it (a PyTorch pickle, TorchScript, float8 tensors, CUDA, the
dequantisers of packed integers, the theory solvers written with torch) call
:func:`require_torch` before they import it, so a missing torch is one typed error that names
what needed it. The paths where torch only helps (CUDA when available, a model class built on
the meta device) ask :func:`torch_installed` and go on without it.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Optional

from wbfe.errors import MissingDependencyError

__all__ = ["TORCH_INSTALL", "loaded", "require_torch", "torch_installed"]

TORCH_INSTALL = "pip install 'wbfe[torch]'"


def require_torch(what: str) -> ModuleType:
    """torch, imported; ``what`` (e.g. ``"reading a PyTorch pickle"``) names the need in the error.

    Raises:
        MissingDependencyError: torch is not installed.
    """
    try:
        import torch
    except ImportError:
        raise MissingDependencyError(f"{what} needs torch: {TORCH_INSTALL}", package="torch") from None
    return torch


def torch_installed() -> bool:
    """Whether torch can be imported, asked without importing it (which costs about 1.5 s)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a torch entry of None or without a spec in sys.modules
        return False


def loaded(name: str) -> Optional[ModuleType]:
    """The module ``name`` if this process has finished importing it; None if it has not, if its
    import is blocked (a None entry in ``sys.modules``), or while a thread is still importing it.

    A module enters ``sys.modules`` when its import starts, not when it ends: read from there while
    a pipeline thread imported torch, it had no ``Tensor`` yet, and scoring crashed (issue 45 §12).
    The spec's ``_initializing`` flag is the one CPython's own ``import`` reads to wait for such a
    module; a module whose import has not finished cannot have made the object asked about.
    """
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module
