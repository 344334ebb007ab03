"""NumPy .npz archives (wbfe/sources/numpy_files.py): arrays written by np.savez and
np.savez_compressed read back equal, an object array skipped without unpickling, a damaged archive a
typed error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from wbfe.errors import CorruptCheckpointError
from wbfe.linalg.arrays import to_torch
from wbfe.sources import open_source

RNG = np.random.default_rng(5)
ARRAYS = {"fc1.weight": RNG.standard_normal((6, 4)).astype(np.float32),
          "fc2.weight": RNG.standard_normal((3, 6)).astype(np.float16),
          "conv.weight": np.asfortranarray(RNG.standard_normal((5, 2, 3, 3))),
          "steps": np.arange(4, dtype=np.int64)}


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_arrays_read_back_equal(tmp_path: Path, save: object) -> None:
    save(tmp_path / "weights.npz", **ARRAYS)  # type: ignore[operator]
    with open_source(tmp_path / "weights.npz") as source:
        entries = {e.name: e for e in source.entries()}
        assert source.provenance.format == "npz"
    assert list(entries) == list(ARRAYS)
    for name, array in ARRAYS.items():
        assert entries[name].shape == array.shape and entries[name].dtype == str(array.dtype)
        assert torch.equal(to_torch(entries[name].load()), torch.from_numpy(np.ascontiguousarray(array))), name
    with open_source(tmp_path) as source:  # the folder holding it
        assert [e.name for e in source.entries()] == list(ARRAYS)


def test_object_arrays_are_skipped_never_unpickled(tmp_path: Path) -> None:
    np.savez(tmp_path / "w.npz", ok=ARRAYS["fc1.weight"], obj=np.array([{"a": 1}, None], dtype=object))
    with open_source(tmp_path / "w.npz") as source:
        entries = {e.name: e for e in source.entries()}
    assert entries["obj"].skip == "object array: only a pickle can hold it, and wbfe does not unpickle .npz members"
    assert entries["ok"].skip is None


def test_arrays_of_no_weight_dtype_are_skipped_saying_which(tmp_path: Path) -> None:
    """Text and dates are no weights: listed as skipped with their dtype, never read as numbers."""
    np.savez(tmp_path / "w.npz", ok=ARRAYS["fc1.weight"], words=np.array(["a", "bc"]),
             when=np.array(["2024-01-01"], dtype="datetime64[D]"))
    with open_source(tmp_path / "w.npz") as source:
        entries = {e.name: e for e in source.entries()}
    assert (entries["words"].skip, entries["when"].skip) == ("<U2 array: not a weight dtype",
                                                             "datetime64[D] array: not a weight dtype")
    assert entries["ok"].skip is None


@pytest.mark.parametrize("damage", ["truncated", "garbage", "bad-header", "no-arrays", "huge-shape", "leading-bytes"])
def test_damaged_archives_get_a_typed_error(tmp_path: Path, damage: str) -> None:
    import zipfile

    path = tmp_path / "w.npz"
    np.savez(path, **ARRAYS)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:300])
    elif damage == "garbage":
        path.write_bytes(b"PK\x03\x04" + bytes(range(256)))
    elif damage == "leading-bytes":  # zipfile reads it, numpy.load takes it for a pickle (found by fuzzing)
        path.write_bytes(b"junk" + path.read_bytes())
    elif damage == "bad-header":
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("fc.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': 1}    \n")
    elif damage == "huge-shape":  # a header declaring 8 TB over 16 bytes of data: refused before allocating
        header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }".ljust(117) + "\n"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("fc.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\0" * 16)
    else:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("readme.txt", "nothing here")
    with pytest.raises(CorruptCheckpointError, match=str(path)) as info:
        with open_source(path) as source:
            for entry in source.entries():
                entry.load()
    if damage == "huge-shape":
        assert str(info.value).endswith("'fc' holds 16 bytes, its header declares 8000000000000")


def test_a_member_damaged_past_its_header_is_refused_when_read(tmp_path: Path) -> None:
    path = tmp_path / "w.npz"
    np.savez(path, w=RNG.standard_normal((64, 32)))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a byte of the array's data: the header reads, the member fails its CRC-32
    path.write_bytes(bytes(raw))
    with open_source(path) as source:
        (entry,) = source.entries()
        with pytest.raises(CorruptCheckpointError) as info:
            entry.load()
    assert str(info.value) == f"{path}: array 'w' unreadable (Bad CRC-32 for file 'w.npy')"


def test_two_members_of_one_name_are_refused(tmp_path: Path) -> None:
    import io
    import warnings
    import zipfile

    path = tmp_path / "w.npz"
    data = io.BytesIO()
    np.lib.format.write_array(data, ARRAYS["fc1.weight"])
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as zf:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it writes
        zf.writestr("fc.npy", data.getvalue())
        zf.writestr("fc.npy", data.getvalue())
    with pytest.raises(CorruptCheckpointError) as info:
        open_source(path)
    assert str(info.value) == f"{path}: an .npz archive with two members named 'fc.npy'"


def test_a_member_that_is_no_npy_array_is_listed_as_skipped_never_read(tmp_path: Path) -> None:
    """numpy.load lists every member (a non-.npy one as its bytes); wbfe left it out without a word."""
    import zipfile

    from wbfe.errors import UnsupportedDtypeError

    np.savez(tmp_path / "w.npz", ok=ARRAYS["fc1.weight"])
    with zipfile.ZipFile(tmp_path / "w.npz", "a") as zf:
        zf.writestr("notes/extra.pkl", b"\x80\x04N.")
        zf.writestr("notes/", b"")  # a folder entry: no member of its own
    assert sorted(np.load(tmp_path / "w.npz").files) == ["notes/", "notes/extra.pkl", "ok"]
    with open_source(tmp_path / "w.npz") as source:
        entries = {e.name: e for e in source.entries()}
    assert list(entries) == ["ok", "notes/extra.pkl"]
    assert entries["notes/extra.pkl"].skip == "not an .npy array: a member np.savez does not write"
    with pytest.raises(UnsupportedDtypeError, match="not an .npy array"):
        entries["notes/extra.pkl"].load()
