"""Byte-level reads, and the dequantisation of stored integers, that the checkpoint readers share."""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from wbfe.errors import CorruptCheckpointError, TruncatedCheckpointError, WbfeError
from wbfe.sources._base import open_regular
from wbfe.sources.registry import ZIP_ERRORS, open_zip

__all__ = ["read_range", "reading_zip", "dequantize"]


def read_range(path: Path, first: int, nbytes: int) -> "np.ndarray":
    """Bytes ``[first, first + nbytes)`` of a file into a writable ``uint8`` array of their own (a handle of its
    own: safe from any thread); ``TruncatedCheckpointError`` where the file ends first."""
    buffer = np.fromfile(path, dtype=np.uint8, count=nbytes, offset=first)
    if buffer.size != nbytes:
        raise TruncatedCheckpointError.at(path, "cut short while being read")
    return buffer


@contextlib.contextmanager
def reading_zip(path: Path, what: str, why: Callable[[BaseException], str] | None = None) -> Iterator[zipfile.ZipFile]:
    """The zip archive (a ``what``) at ``path``, opened afresh (safe from any thread); a zip error in the block is a
    ``CorruptCheckpointError`` saying ``why(error)``, by default that it is not a readable ``what``."""
    try:
        with open_regular(path) as fh, open_zip(path, fh, what) as archive:
            yield archive
    except WbfeError:
        raise
    except ZIP_ERRORS as exc:
        reason = why(exc) if why else f"not a readable {what} (a damaged zip: {exc.__class__.__name__})"
        raise CorruptCheckpointError.at(path, reason) from None


def dequantize(q: "np.ndarray", scale: Any, zero_point: Any, axis: int, block: int = 0) -> "np.ndarray":
    """TFLite's ``DEQUANTIZE`` and ONNX's ``DequantizeLinear``: ``scale · (q − zero_point)`` in float32, per
    tensor, per index along ``axis`` or per ``block`` of indices along it (``ValueError`` for a scale or zero
    point that does not fit).

    Example:
        >>> import numpy as np
        >>> dequantize(np.array([[-128, 0], [10, 127]], np.int8), [0.5, 2.0], [0, 1], 0).tolist()
        [[-64.0, 0.0], [18.0, 252.0]]
    """
    scale = np.asarray(scale, dtype=np.float32)
    # int32 − int32 can wrap in int32 (8 and 16 bits cannot); a float8's values are no integers to truncate
    wide: Any = (np.int64 if q.dtype.itemsize >= 4 else np.int32) if np.issubdtype(q.dtype, np.integer) else np.float32
    zero = np.zeros_like(scale, dtype=wide) if zero_point is None else np.asarray(zero_point, dtype=wide)
    if zero.shape != scale.shape:
        raise ValueError(f"zero point of shape {zero.shape} for a scale of shape {scale.shape}")
    if scale.size > 1 or block:
        if not -q.ndim <= axis < q.ndim:
            raise ValueError(f"axis {axis} of a {q.ndim}-D tensor")
        axis = axis % q.ndim
        if block:
            if not 0 < block <= q.shape[axis] or scale.ndim != q.ndim or \
                    scale.shape[axis] != -(-q.shape[axis] // block):
                raise ValueError(f"scale of shape {scale.shape} for blocks of {block} along axis {axis} of {q.shape}")
            scale, zero = (np.repeat(a, block, axis=axis).take(range(q.shape[axis]), axis=axis) for a in (scale, zero))
        else:
            if scale.size != q.shape[axis]:
                raise ValueError(f"{scale.size} scales for {q.shape[axis]} slices along axis {axis}")
            shape = [-1 if d == axis else 1 for d in range(q.ndim)]
            scale, zero = scale.reshape(shape), zero.reshape(shape)
    # q − zero point is an integer: exact in float32 for the 8- and 16-bit types. A product past float32's range
    # is inf, as the operator computes it, and the planner skips it as non-finite.
    with np.errstate(over="ignore", invalid="ignore"):
        return ((q.astype(wide) - zero).astype(np.float32) * scale).astype(np.float32)
