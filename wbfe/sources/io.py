"""Byte-level reads the checkpoint readers share."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wbfe.errors import TruncatedCheckpointError

__all__ = ["read_range"]


def read_range(path: Path, first: int, nbytes: int) -> "np.ndarray":
    """Bytes ``[first, first + nbytes)`` of a file into a writable ``uint8`` array of their own (a handle of its
    own: safe from any thread); ``TruncatedCheckpointError`` where the file ends first."""
    buffer = np.fromfile(path, dtype=np.uint8, count=nbytes, offset=first)
    if buffer.size != nbytes:
        raise TruncatedCheckpointError.at(path, "cut short while being read")
    return buffer
