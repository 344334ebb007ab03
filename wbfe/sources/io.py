"""Byte-level reads the checkpoint readers share."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from wbfe.errors import TruncatedCheckpointError

__all__ = ["read_range"]


def read_range(path: Path, first: int, nbytes: int) -> "np.ndarray":
    """Bytes ``[first, first + nbytes)`` of a file into a writable ``uint8`` array of their own (``pread``: safe
    from any thread); ``TruncatedCheckpointError`` where the file ends first."""
    buffer = np.empty(nbytes, dtype=np.uint8)
    view = buffer.data  # a memoryview of the array's bytes
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < nbytes:
            n = os.preadv(fd, [view[done:]], first + done)
            if n <= 0:
                raise TruncatedCheckpointError(f"{path}: cut short while being read", path=str(path))
            done += n
    finally:
        os.close(fd)
    return buffer
