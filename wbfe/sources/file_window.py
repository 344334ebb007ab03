"""A stored zip member read in place, as a read-only seekable file, so that h5py reads a Keras archive's
weights without a copy (here and in the HDF5 guard's child)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any, Union

__all__ = ["FileWindow"]


class FileWindow(io.RawIOBase):
    """``size`` bytes of the file at ``path`` from ``offset`` (``zipfile.BadZipFile`` past its end)."""

    def __init__(self, path: Union[str, Path], offset: int, size: int, what: str = "the member"):
        super().__init__()
        self._fh = open(path, "rb")
        self._offset, self._size, self._pos = offset, size, 0
        if self._fh.seek(0, io.SEEK_END) < offset + size:
            self._fh.close()
            raise zipfile.BadZipFile(f"{what} runs past the end of the archive")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        self._fh.seek(self._offset + self._pos)
        got = self._fh.readinto(view[:n]) or 0
        self._pos += got
        return got

    def close(self) -> None:
        self._fh.close()
        super().close()
