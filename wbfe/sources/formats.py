"""Which reader a file calls for, from its first bytes (and only then its suffix): GGUF, Keras
(HDF5 ``.h5`` or the Keras 3 ``.keras`` zip) and ONNX. Safetensors and PyTorch files are left to
:mod:`wbfe.sources.local`. Also the one byte-range read those readers share.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from wbfe.errors import CorruptCheckpointError, TruncatedCheckpointError
from wbfe.sources._base import TensorSource

if TYPE_CHECKING:
    import numpy as np

__all__ = ["sniff_format", "open_other_format", "pick_other_format", "read_range", "OTHER_SUFFIXES"]

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
ZIP_MAGIC = b"PK\x03\x04"
GGUF_SUFFIXES = (".gguf",)
KERAS_SUFFIXES = (".h5", ".hdf5", ".keras")
ONNX_SUFFIXES = (".onnx",)
OTHER_SUFFIXES = GGUF_SUFFIXES + KERAS_SUFFIXES + ONNX_SUFFIXES
# Members of a Keras 3 archive (keras.saving.saving_lib): the weights and the model's config.
KERAS_ARCHIVE_MEMBERS = ("model.weights.h5", "config.json")


def sniff_format(path: Path) -> str | None:
    """``gguf``, ``keras`` or ``onnx`` for a file one of those readers takes, else None.

    GGUF and HDF5 files are told by their magic bytes and a Keras 3 archive by the members of its
    zip, whatever the file's name; ONNX (a protobuf, with no magic) by its ``.onnx`` suffix, its
    reader then checking that it parses.
    """
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return None
    if head[:4] == b"GGUF":
        return "gguf"
    if head == HDF5_MAGIC:
        return "keras"
    if head[:4] == ZIP_MAGIC and _is_keras_archive(path):
        return "keras"
    name = path.name.lower()
    # A file named for one of these formats whose bytes say otherwise goes to that reader, which
    # reports what is wrong with it (the reader of the suffix the user chose).
    for kind, suffixes in (("gguf", GGUF_SUFFIXES), ("keras", KERAS_SUFFIXES), ("onnx", ONNX_SUFFIXES)):
        if name.endswith(suffixes):
            return kind
    return None


def _is_keras_archive(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    return all(member in names for member in KERAS_ARCHIVE_MEMBERS)


def open_other_format(path: Path, kind: str, ref: str) -> TensorSource:
    """Open ``path`` with the reader :func:`sniff_format` named."""
    if kind == "gguf":
        from wbfe.sources.gguf_files import GGUFSource

        return GGUFSource(ref, path)
    if kind == "keras":
        from wbfe.sources.keras_files import KerasSource

        return KerasSource(ref, path)
    from wbfe.sources.onnx_files import OnnxSource

    return OnnxSource(ref, path)


def pick_other_format(names: Sequence[str]) -> list[str]:
    """The GGUF, Keras or ONNX file among a folder's files: ``[file]`` (the first split of a GGUF
    split set), or ``[]`` when there is none.

    Raises:
        CorruptCheckpointError: several such files (say, two quantisations of one model).
    """
    from wbfe.sources.gguf_files import SPLIT_NAME

    files = []
    for name in sorted(names):
        split = SPLIT_NAME.match(name)
        if split is not None and int(split["no"]) != 1:
            continue  # one set, named by its first split
        if name.lower().endswith(OTHER_SUFFIXES):
            files.append(name)
    if len(files) > 1:
        raise CorruptCheckpointError(
            f"several weight files ({', '.join(files[:4])}{', ...' if len(files) > 4 else ''}); pass one file explicitly"
        )
    return files


def read_range(path: Path, first: int, nbytes: int) -> "np.ndarray":
    """Bytes ``[first, first + nbytes)`` of a file into an array of their own (``pread``: no shared
    file position, so safe from a read-ahead thread).

    Raises:
        TruncatedCheckpointError: the file ends first (it changed since its header was checked).
    """
    import numpy as np

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
