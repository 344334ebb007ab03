"""Tensors as the readers hand them over: a numpy array where numpy has the dtype, a torch tensor where only torch
does (bfloat16, the float8 kinds) or where the reader is torch's own. A float32 or float16 checkpoint is thereby scored
without importing torch (seconds of start-up); the functions here take either kind, and a feature written with torch
takes :func:`to_torch` of what it is given (no copy)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from wbfe._deps import loaded, require_torch, torch_installed

__all__ = ["NUMPY_DTYPES", "WIDENED_DTYPES", "is_known_dtype", "holds_without_torch", "widen", "is_torch", "to_torch",
           "to_numpy", "dtype_name", "itemsize", "from_bytes", "flat_bytes", "torch_loaded"]

# wbfe's dtype names (torch's, without the prefix) that numpy holds as they are stored.
NUMPY_DTYPES: dict[str, Any] = {name: np.dtype(name).type for name in (
    "float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool")}
# Bytes per element of every dtype wbfe knows, so that sizes are known without importing torch.
_ITEMSIZE = {**{name: np.dtype(name).itemsize for name in NUMPY_DTYPES}, "bfloat16": 2, "float8_e4m3fn": 1,
             "float8_e5m2": 1, "float8_e8m0fnu": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "complex64": 8,
             "complex128": 16}


# The dtype numpy lacks whose every value a numpy float holds exactly (bfloat16, the top half of a
# float32), read without torch where torch is not installed.
WIDENED_DTYPES = ("bfloat16",)


def widen(raw: np.ndarray, dtype: str, shape: Sequence[int]) -> np.ndarray:
    """The ``dtype`` tensor (one of :data:`WIDENED_DTYPES`) held in the uint8 ``raw``, exactly, as a numpy
    float32 copy of ``shape``."""
    if dtype != "bfloat16":
        raise ValueError(f"numpy cannot hold {dtype} exactly")
    flat = np.ascontiguousarray(raw).reshape(-1)
    return (flat.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(tuple(shape))


def holds_without_torch(dtype: str) -> bool:
    """Whether a ``dtype`` tensor is read without torch here (numpy holds it, or it is widened)."""
    return dtype in NUMPY_DTYPES or (dtype in WIDENED_DTYPES and not torch_loaded() and not torch_installed())


def is_known_dtype(dtype: str) -> bool:
    """Whether ``dtype`` names a tensor dtype wbfe holds, asked without importing torch."""
    return dtype in _ITEMSIZE


def torch_loaded() -> bool:
    """Whether torch has been imported in this process, its import finished."""
    return loaded("torch") is not None


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor, asked without importing torch (no tensor exists before its import has
    finished)."""
    torch = loaded("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def to_torch(x: Any) -> Any:
    """``x`` as a torch tensor: itself, or a numpy array's memory shared (no copy)."""
    if is_torch(x):
        return x
    require_torch("a step written with torch")
    import torch

    return torch.from_numpy(np.asarray(x))


def to_numpy(x: Any) -> np.ndarray:
    """``x`` as a numpy array on the host: itself, a CPU tensor's memory shared, or for the dtypes numpy
    lacks a float32 copy, which holds their values exactly."""
    if not is_torch(x):
        return np.asarray(x)
    import torch

    x = x.detach().cpu()  # itself where it is on the CPU already
    if dtype_name(x) not in NUMPY_DTYPES:
        x = x.to(torch.float32)
    return x.numpy()


def dtype_name(x: Any) -> str:
    """wbfe's name of ``x``'s dtype (torch's, without the ``torch.`` prefix): ``float32``, ``bfloat16``..."""
    if is_torch(x):
        return str(x.dtype).removeprefix("torch.")
    return np.dtype(x.dtype).name


def itemsize(dtype: str) -> int:
    """Bytes per element of the torch dtype named ``dtype``.

    Raises:
        AttributeError: ``dtype`` names no torch dtype.
        MissingDependencyError: torch, which alone knows such a dtype, is not installed.
    """
    if dtype in _ITEMSIZE:
        return _ITEMSIZE[dtype]
    require_torch(f"a {dtype} tensor")
    import torch

    return int(getattr(torch, dtype).itemsize)


def from_bytes(raw: np.ndarray, dtype: str, shape: Sequence[int]) -> Any:
    """The tensor of ``dtype`` and ``shape`` held in the uint8 ``raw`` (no copy): a numpy array when numpy
    has the dtype, else a torch tensor, or without torch a widened numpy copy (:func:`widen`).

    Raises:
        AttributeError: ``dtype`` names no torch dtype.
        MissingDependencyError: torch is not installed (numpy has no such dtype).
    """
    if dtype in NUMPY_DTYPES:
        return raw.view(NUMPY_DTYPES[dtype]).reshape(tuple(shape))
    if holds_without_torch(dtype):
        return widen(raw, dtype, shape)
    require_torch(f"reading {dtype} tensors (numpy has no {dtype})")
    import torch

    if raw.size == 0 and math.prod(shape) == 0:  # torch views no zero-length buffer as a wider dtype
        return torch.empty(tuple(shape), dtype=getattr(torch, dtype))
    return torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(tuple(shape))


def flat_bytes(x: Any) -> np.ndarray:
    """The bytes of ``x`` in C order, as a flat uint8 numpy array (a copy only where it must be)."""
    if is_torch(x):
        x = x.detach().cpu()
        import torch

        return x.contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)
