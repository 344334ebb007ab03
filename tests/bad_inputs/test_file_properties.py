"""Property-based tests of the safetensors header parser and the shard index (issue #16).

Invariant: a typed ``WbfeError`` or a correct result, never another exception. "Correct" is judged
by the reference ``safetensors`` package for headers (wbfe accepts a header exactly when it does,
and then reads the same tensors), and by the index's own ``weight_map`` for shards (every tensor
listed is streamed once, from a file inside the checkpoint's folder).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from wbfe.errors import WbfeError
from wbfe.linalg.arrays import to_torch
from wbfe.sources import open_source
from wbfe.sources.safetensors_files import SAFETENSORS_DTYPES, index_shards, read_header

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# --- safetensors headers ----------------------------------------------------------------------------

_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F4": 0.5}

counts = st.one_of(st.integers(0, 6), st.integers(-3, -1), st.just(2**64), st.floats(0, 4, allow_nan=False),
                   st.booleans(), st.text(max_size=2))
dtypes = st.one_of(st.sampled_from(sorted(_BYTES)), st.sampled_from(["f32", "F33", "", "C128"]),
                   st.lists(st.just("F32"), max_size=1), st.integers(0, 3))


@st.composite
def headers(draw: Any) -> tuple[dict[str, Any], bytes]:
    """Headers that are mostly well formed (contiguous offsets matching the shapes), with some
    fields replaced by wrong types, wrong sizes, gaps, overlaps and trailing bytes."""
    names = draw(st.lists(st.text(min_size=1, max_size=6), max_size=5, unique=True))
    header: dict[str, Any] = {}
    position = 0
    for name in names:
        dtype = draw(st.sampled_from(sorted(_BYTES)))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        size = int(np.prod(shape, dtype=np.int64)) * _BYTES[dtype]
        if size != int(size):  # an odd number of 4-bit values fills no whole byte
            shape = shape + [2]
            size = int(np.prod(shape, dtype=np.int64)) * _BYTES[dtype]
        start = position + draw(st.sampled_from([0, 0, 0, 0, 1, -1]))
        entry: dict[str, Any] = {"dtype": dtype, "shape": shape, "data_offsets": [start, start + int(size)]}
        if draw(st.integers(0, 9)) == 0:
            entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(
                st.one_of(dtypes, st.lists(counts, max_size=3), counts))
        if draw(st.integers(0, 19)) == 0:
            del entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))]
        header[name] = entry
        position = max(position, start + int(size))
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.one_of(
            st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
            st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=1),
            st.none(), st.lists(st.text(max_size=2), max_size=1)))
    data = bytes(max(0, position + draw(st.sampled_from([0, 0, 0, 1, -1]))))
    return header, data


def _write(path: Path, raw: bytes, data: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _reference(path: Path) -> dict[str, tuple[str, list[int]]] | None:
    """What the safetensors package reads from the file, or None where it refuses it."""
    try:
        with safe_open(str(path), "np") as f:
            f.metadata()
            return {key: (f.get_slice(key).get_dtype(), list(f.get_slice(key).get_shape())) for key in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError):
        return None


def _ours(path: Path) -> dict[str, tuple[str, list[int]]] | None:
    try:
        tensors, metadata = read_header(path)
    except WbfeError:
        return None
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    offsets = [info["data_offsets"] for info in tensors.values()]
    assert offsets == sorted(offsets)
    return {name: (info["dtype"], info["shape"]) for name, info in tensors.items()}


@pytest.fixture(scope="module")
def scratch() -> Any:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


@SETTINGS
@given(headers())
def test_header_parser_agrees_with_safetensors(scratch: Path, case: tuple[dict[str, Any], bytes]) -> None:
    header, data = case
    path = scratch / "h.safetensors"
    _write(path, json.dumps(header).encode(), data)
    ours, reference = _ours(path), _reference(path)
    assert (ours is None) == (reference is None), (header, len(data), ours, reference)
    if ours is not None:
        assert ours == reference


@SETTINGS
@given(st.data())
def test_header_bytes_mutated(scratch: Path, data: Any) -> None:
    """Random byte edits of a real file's header: wbfe refuses whatever safetensors refuses."""
    path = scratch / "m.safetensors"
    save_file({"a": np.zeros((3, 4), np.float32), "b": np.ones(5, np.int16), "c": np.zeros(0, np.float64)}, str(path))
    blob = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", bytes(blob[:8]))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, 8 + n - 1))
        blob[at] = data.draw(st.integers(0, 255))
    path.write_bytes(bytes(blob))
    ours, reference = _ours(path), _reference(path)
    if reference is None:
        assert ours is None
    elif ours is not None:
        assert ours == reference


@SETTINGS
@given(st.binary(max_size=64), st.binary(max_size=64))
def test_header_random_bytes(scratch: Path, raw: bytes, data: bytes) -> None:
    path = scratch / "r.safetensors"
    _write(path, raw, data)
    ours, reference = _ours(path), _reference(path)
    assert (ours is None) == (reference is None)


def test_dtype_table_matches_the_format() -> None:
    """Every dtype the reference writes is known, with its size, and no unknown one is accepted."""
    for code, (_, size) in SAFETENSORS_DTYPES.items():
        if code in _BYTES:
            assert size == _BYTES[code]


# --- shard indexes ----------------------------------------------------------------------------------

SHARDS = ["s1.safetensors", "s2.safetensors", "sub/s3.safetensors"]
shard_names = st.one_of(
    st.sampled_from(SHARDS),
    st.sampled_from(["./s1.safetensors", "sub/./s3.safetensors", ".//s2.safetensors", "sub//s3.safetensors"]),
    st.sampled_from(["../s1.safetensors", "/etc/passwd", "sub/../s1.safetensors", "link/s1.safetensors",
                     "sub", "missing.safetensors", "", ".", "s1.safetensors\0", "..\\s1.safetensors"]),
    st.text(alphabet="./s12ub", max_size=12),
    st.integers(), st.none(), st.lists(st.just("s1.safetensors"), max_size=1),
)


@pytest.fixture(scope="module")
def checkpoint(scratch: Path) -> Path:
    """Three shards (one in a subfolder) each holding t0..t3, a folder symlink, and a file outside."""
    folder = scratch / "ckpt"
    (folder / "sub").mkdir(parents=True)
    for i, shard in enumerate(SHARDS):
        save_file({f"t{k}": np.full((2, 3), 10 * i + k, np.float32) for k in range(4)}, str(folder / shard))
    save_file({"t0": np.zeros((2, 3), np.float32)}, str(scratch / "outside.safetensors"))
    os.symlink(scratch, folder / "link")
    return folder


@SETTINGS
@given(st.dictionaries(st.sampled_from([f"t{k}" for k in range(4)]), shard_names, max_size=4))
def test_shard_index(checkpoint: Path, weight_map: dict[str, Any]) -> None:
    index = checkpoint / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    try:
        shards = {path.relative_to(checkpoint).as_posix(): names for path, names in index_shards(index)}
    except WbfeError:
        return
    root = checkpoint.resolve()
    assert sorted(t for names in shards.values() for t in names) == sorted(weight_map)
    for shard in shards:
        path = checkpoint / shard
        assert path.is_file() and ".." not in Path(shard).parts and not Path(shard).is_absolute()
        assert path.resolve().is_relative_to(root)
    try:
        with open_source(index) as source:
            entries = list(source.entries())
            streamed = {e.name: (to_torch(e.load()).flatten()[0].item()) for e in entries if e.skip is None}
            unlisted = [e for e in entries if e.skip is not None]
            assert len(source) == len(entries)
    except WbfeError:
        return
    assert sorted(streamed) == sorted(weight_map)  # every listed tensor once, none dropped
    # What a listed shard holds besides is accounted for as skipped, each name once, none listed.
    assert len({e.name for e in entries}) == len(entries)
    # A listed shard's copy of a name the index gives to another shard is a row of its own, SHARD/NAME.
    copies = [e for e in unlisted if "a second copy of" in (e.skip or "")]
    unlisted = [e for e in unlisted if e not in copies]
    assert sorted(e.name.rsplit("/", 1)[1] for e in copies) == sorted(
        t for names in shards.values() for t in weight_map if t not in names)
    assert all(e.name not in weight_map and "not listed in model.safetensors.index.json" in (e.skip or "")
               for e in unlisted)
    # Every shard holds t0..t3, so with any shard read, each name the index lacks is skipped once.
    assert sorted(e.name for e in unlisted) == (sorted({f"t{k}" for k in range(4)} - set(weight_map)) if shards else [])
    for name, shard in weight_map.items():
        i = SHARDS.index("/".join(p for p in shard.split("/") if p not in ("", ".")))
        assert streamed[name] == 10 * i + int(name[1])  # from the shard the index names
