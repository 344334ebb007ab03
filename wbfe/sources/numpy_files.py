"""NumPy ``.npz`` archives (``np.savez``): one ``.npy`` member per array, headers read when opened and data
on demand, always with ``allow_pickle=False`` (an object array is listed as skipped, never unpickled)."""

from __future__ import annotations

import functools
import math
import tokenize
import zipfile
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from wbfe.errors import CorruptCheckpointError, UnsupportedDtypeError
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource, open_regular
from wbfe.sources.io import reading_zip
from wbfe.sources.registry import ZIP_ERRORS, FileFormat, open_zip, register_format

__all__ = ["NpzSource", "NPZ", "numpy_dtype_name"]

# A damaged member's .npy header: the zip's errors, and numpy's header parser's (a SyntaxError, or
# tokenize's TokenError for an unclosed bracket: found by fuzzing).
_HEADER_ERRORS: tuple[type[BaseException], ...] = (*ZIP_ERRORS, SyntaxError, tokenize.TokenError)
# What numpy.load takes for a zip (an .npz): a local file header or an empty archive's end record.
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
# numpy dtype names torch holds as they are.
_TORCH_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}


def numpy_dtype_name(dtype: Any) -> Optional[str]:
    """wbfe's dtype name for a numpy dtype torch can hold (``float32``...), in either byte order
    (a big-endian array is read as the same numbers in native order), else None."""
    name = getattr(dtype, "name", None)  # whatever the byte order
    return name if name in _TORCH_DTYPES else None


class NpzSource(TensorSource):
    """The arrays of an ``.npz`` archive, read one member at a time."""

    def __init__(self, path: Path, ref: str, fmt: Optional[str] = None):
        self._path = path
        with open_regular(path) as fh:
            # numpy.load takes a file for a zip only by its first bytes; zipfile would also take one
            # with bytes before the archive (found by fuzzing), which numpy reads as a pickle.
            if fh.read(4) not in _ZIP_MAGIC:
                raise CorruptCheckpointError.at(path, "not an .npz archive (it does not start as a zip file)")
            fh.seek(0)
            with open_zip(path, fh, ".npz archive") as archive:
                self._entries = [self._header(archive, info) for info in archive.infolist()
                                 if info.filename.endswith(".npy")]
                others = [info.filename for info in archive.infolist()
                          if not info.filename.endswith(".npy") and not info.is_dir()]
        if not self._entries:
            raise CorruptCheckpointError.at(path, "an .npz archive with no .npy arrays")
        # a member np.savez never writes (numpy.load gives its bytes): listed, not read
        self._entries += [TensorEntry(name=name, shape=(), dtype="npz-member", load=functools.partial(_not_array, name),
                                      skip="not an .npy array: a member np.savez does not write") for name in others]
        names = [entry.name + ".npy" for entry in self._entries]
        if len(set(names)) != len(names):  # a member is read by its name: which of two would be read?
            twice = next(n for n in names if names.count(n) > 1)
            raise CorruptCheckpointError.at(path, f"an .npz archive with two members named {twice!r}")
        self.provenance = Provenance(source=ref, format="npz", files=[str(path)], pending=FileDigest([path]))

    def _header(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> TensorEntry:
        name = info.filename[: -len(".npy")]
        try:
            with archive.open(info) as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(fh)
                data_start = fh.tell()
        except _HEADER_ERRORS as exc:
            raise CorruptCheckpointError.at(
                self._path, f"array {name!r} has no readable .npy header ({str(exc)[:80]})") from None
        need = math.prod(int(d) for d in shape) * dtype.itemsize
        if not dtype.hasobject and info.file_size - data_start != need:  # before any allocation of that size
            raise CorruptCheckpointError.at(self._path, f"array {name!r} holds {info.file_size - data_start} bytes, "
                                            f"its header declares {need}")
        torch_dtype = numpy_dtype_name(dtype)
        skip = ("object array: only a pickle can hold it, and wbfe does not unpickle .npz members" if dtype.hasobject
                else f"{dtype} array: not a weight dtype" if torch_dtype is None else None)
        return TensorEntry(name=name, shape=tuple(int(s) for s in shape), dtype=torch_dtype or str(dtype),
                           load=functools.partial(self.read, name), skip=skip)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> Iterator[TensorEntry]:
        return iter(self._entries)

    def read(self, name: str) -> Any:
        """One array, read with ``allow_pickle=False`` (``CorruptCheckpointError`` for a damaged member)."""
        why = f"array {name!r} unreadable"
        with reading_zip(self._path, ".npz archive", lambda exc: f"{why} ({str(exc)[:80]})") as archive:
            with archive.open(name + ".npy") as f:
                array = np.lib.format.read_array(f, allow_pickle=False)
        # np.array, not ascontiguousarray, which makes a 0-d array 1-d; native byte order for torch.
        return np.array(array, dtype=array.dtype.newbyteorder("="), order="C")


def _not_array(name: str) -> Any:
    raise UnsupportedDtypeError(f"{name}: a member of the .npz archive that is not an .npy array", name=name)


NPZ = register_format(FileFormat(name="npz", suffixes=(".npz",), open=NpzSource, group="more", rank=40))
