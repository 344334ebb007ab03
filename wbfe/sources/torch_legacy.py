"""The records of a legacy (pre-1.6, non-zip) PyTorch checkpoint, checked before torch reads it: torch hands
over a storage its key list leaves out, or whose record is short, as uninitialised memory (found by fuzzing).
Read with an unpickler that builds and imports nothing; where it cannot follow a file, torch decides.
"""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path
from typing import Any, BinaryIO

from wbfe.errors import CorruptCheckpointError

__all__ = ["check_legacy_records"]

# Bytes per element of the typed storages a legacy file names (``torch.FloatStorage``...).
_ITEMSIZE = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
    "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16}


def _load_any_protocol(self: Any) -> None:
    """PROTO as torch's weights-only unpickler reads it: not checked (torch reads past an unknown protocol)."""
    self.proto = self.read(1)[0]


class _Plain(pickle._Unpickler):
    """For the header pickles and the key list: plain data only."""

    # The pure-Python unpickler's opcode table with that PROTO: the C unpickler's cannot be changed.
    dispatch = {**pickle._Unpickler.dispatch, pickle.PROTO[0]: _load_any_protocol}

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} in a legacy checkpoint's plain records")


class _Placeholder:
    """Stands for any object the pickle names: takes every argument and every item, does nothing."""

    qualname = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    __setstate__ = __setitem__ = append = extend = __init__


class _Records(_Plain):
    """Reads the object pickle for its storage records alone: every class is a placeholder."""

    def __init__(self, fh: Any):
        super().__init__(fh)
        # key -> (bytes per element, element count); 0 bytes: a storage class this check does not know
        self.storages: dict[str, tuple[int, int]] = {}

    def find_class(self, module: str, name: str) -> Any:
        return type(name, (_Placeholder,), {"qualname": f"{module}.{name}"})

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            module, _, name = str(getattr(pid[1], "qualname", "")).rpartition(".")
            if isinstance(pid[2], str) and isinstance(pid[4], int):
                self.storages[pid[2]] = (_ITEMSIZE.get(name, 0) if module == "torch" else 0, pid[4])
        return _Placeholder()


def check_legacy_records(path: Path, fh: BinaryIO) -> None:
    """Refuse a legacy checkpoint whose storage records disagree with its object, run past the end of the
    file, or leave a storage without its record (``CorruptCheckpointError``); where this check cannot
    follow the pickles, torch decides."""
    size_of_file = fh.seek(0, io.SEEK_END)
    fh.seek(0)
    try:
        magic, _protocol, _info = (_Plain(fh).load() for _ in range(3))
        # The system info is not looked at: torch ignores it too, and reads each record's count as
        # little-endian whatever it says (a check that gave up on a damaged "little_endian" key left
        # torch to fill storages unchecked, found by fuzzing).
        if magic != 0x1950A86A20F9469CFC6C:
            return
        reader = _Records(fh)
        reader.load()
        keys = _Plain(fh).load()
    except Exception:  # noqa: BLE001 - a pickle this check cannot follow: torch's own loader decides
        return
    storages = reader.storages
    if not isinstance(keys, (list, tuple)) or any(not isinstance(k, str) or k not in storages for k in keys) \
            or any(size == 0 for size, _ in storages.values()):  # a storage class this check does not know
        return
    filled: set[str] = set()  # the keys of the records the file holds
    for key in keys:
        size, declared = storages[key]
        head = fh.read(8)
        filled.add(key)
        # a record whose count itself is cut off lies past the end, whatever it held
        count, start = (struct.unpack("<q", head)[0], fh.tell()) if len(head) == 8 else (declared, size_of_file + 1)
        if count != declared:
            raise CorruptCheckpointError.at(
                path, f"corrupt legacy PyTorch checkpoint (storage {key[:40]} holds {count} elements in the file, "
                f"{declared} in its tensor: torch would read uninitialised memory)")
        if start + count * size > size_of_file:  # checked before seek, which would go past the end
            raise CorruptCheckpointError.at(
                path, f"truncated legacy PyTorch checkpoint (storage {key[:40]} runs past the end of the file)")
        if len(head) < 8:
            break
        fh.seek(max(0, count) * size, io.SEEK_CUR)
    unfilled = sorted(set(storages) - filled)
    if unfilled:
        raise CorruptCheckpointError.at(
            path, f"corrupt legacy PyTorch checkpoint ({len(unfilled)} of its {len(storages)} storages have no "
            "record in the file: torch would hand them over as uninitialised memory)")
