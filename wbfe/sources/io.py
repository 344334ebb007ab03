"""Byte-level reads the checkpoint readers share."""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from wbfe.errors import CorruptCheckpointError, TruncatedCheckpointError, WbfeError
from wbfe.sources._base import open_regular
from wbfe.sources.registry import ZIP_ERRORS, open_zip

__all__ = ["read_range", "reading_zip"]


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
