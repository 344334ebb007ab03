"""GGUF (llama.cpp) files, one file or a split set ``name-00001-of-0000N.gguf``, parsed and dequantised
one tensor at a time by the ``gguf`` package; dimensions (stored innermost first) reported out × in."""

from __future__ import annotations

import functools
import math
import re
import struct
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from wbfe._deps import require
from wbfe.errors import CorruptCheckpointError, SourceNotFoundError, TruncatedCheckpointError, clip
from wbfe.framework import FrameworkDescription
from wbfe.linalg.arrays import from_bytes
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource
from wbfe.sources.io import read_range
from wbfe.sources.registry import FileFormat, register_format

__all__ = ["GGUFSource", "GGUF_MAGIC", "SPLIT_NAME", "split_files", "GGUF"]

GGUF_MAGIC = b"GGUF"
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
# Stored as numbers torch reads directly: no dequantiser, no ``quant``.
_PLAIN = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I8": "int8", "I16": "int16",
          "I32": "int32", "I64": "int64"}
# Metadata recorded in the provenance (``general.file_type`` is decoded to its llama.cpp name).
_METADATA_KEYS = ("general.architecture", "general.name", "general.file_type", "general.quantization_version")


def _gguf() -> Any:
    return require("gguf", "reading GGUF files needs the gguf package: pip install 'wbfe[gguf]'")


def split_files(path: Path) -> list[Path]:
    """The files of the split set ``path`` belongs to, in order (``SourceNotFoundError`` for a missing one)."""
    found = SPLIT_NAME.match(path.name)
    if found is None:
        return [path]
    count = int(found["count"])
    files = [path.with_name(f"{found['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [i for i, f in enumerate(files, 1) if not f.is_file()]
    if missing or not 1 <= int(found["no"]) <= count:
        number = missing[0] if missing else int(found["no"])
        raise SourceNotFoundError.at(
            path, f"split {number} of {count} ({path.name.replace(found['no'], f'{number:05d}', 1)}) is missing")
    return files


class _Split:
    def __init__(self, path: Path):
        gguf = _gguf()
        self.path = path
        size = _check_header(path)
        try:
            reader = gguf.GGUFReader(path)
        except ValueError as exc:
            # The reader's views of tensor data that the file is too short for fail to reshape.
            if "reshape" in str(exc) or "out of bounds" in str(exc):
                raise TruncatedCheckpointError.at(path, "truncated GGUF file (tensor data runs past the end of its "
                                                  f"{size} bytes)") from None
            raise CorruptCheckpointError.at(path, f"corrupt or truncated GGUF header ({_one_line(exc)})") from None
        except (IndexError, KeyError, OverflowError, TypeError, UnicodeDecodeError, MemoryError) as exc:
            raise CorruptCheckpointError.at(
                path, f"corrupt or truncated GGUF header ({exc.__class__.__name__}: {_one_line(exc)})") from None
        self.metadata = _metadata(reader, gguf)
        self.split_count = _field(reader, "split.count")
        # (name, quant type name, dims out x in, first byte, byte count): plain values only, so the
        # reader and its memory map of the whole file are freed here.
        self.tensors: list[tuple[str, str, tuple[int, ...], int, int]] = []
        for t in reader.tensors:
            first, nbytes = int(t.data_offset), int(t.n_bytes)
            if first < 0 or first + nbytes > size:
                raise TruncatedCheckpointError.at(
                    path, f"tensor {t.name!r} lies past the end of the file ({first + nbytes} > {size} bytes)")
            dims = tuple(int(d) for d in reversed(t.shape.tolist()))
            self.tensors.append((t.name, t.tensor_type.name, dims, first, nbytes))
        # ggml's gguf_init_from_file, which llama.cpp loads with, requires each tensor's data right after the one
        # before it in the header, padded to the alignment; gguf-py takes any offset, and a gap, an overlap or two
        # tensors' data swapped were scored as weights llama.cpp never reads.
        expected = 0
        for name, _, _, first, nbytes in self.tensors:
            if first - reader.data_offset != expected:
                raise CorruptCheckpointError.at(
                    path, f"tensor {name!r} has data offset {first - reader.data_offset}, expected {expected}: "
                    f"llama.cpp's loader refuses tensor data not packed in header order at {reader.alignment}-byte "
                    "alignment")
            expected += -(-nbytes // reader.alignment) * reader.alignment


# The fewest bytes a header entry takes: a key-value pair (key length, type, a 1-byte value) and a
# tensor's description (name length, dimension count, type, offset).
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8
# The most of a file read to check its key-value section (a vocabulary of 256k tokens takes ~5 MB).
_MAX_HEADER_SCAN = 64 << 20
# GGUF value types: byte size of each scalar type (8 STRING and 9 ARRAY have their own layout).
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_MAX_ARRAY_DEPTH = 8


def _check_header(path: Path) -> int:
    """The file's size, once its magic, counts and key-values are checked to fit in it before gguf reads them
    (past the end gguf reads nothing and goes on, or reads empty array elements without moving on: a count of
    10⁶ in a 100-byte file built 10⁶ fields, a count of 10¹² ran it out of memory; found by fuzzing)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        data = fh.read(min(size, _MAX_HEADER_SCAN))
    if len(data) < 4:
        raise TruncatedCheckpointError.at(path, f"truncated GGUF file ({size} bytes)")
    if data[:4] != GGUF_MAGIC:
        raise CorruptCheckpointError.at(path, f"not a GGUF file (magic {data[:4]!r}, expected {GGUF_MAGIC!r})")
    if len(data) < 24:
        raise TruncatedCheckpointError.at(path, f"truncated GGUF header ({size} bytes)")
    # A big-endian file's version, read little-endian, has its low 16 bits zero (gguf's test).
    order = ">" if struct.unpack_from("<I", data, 4)[0] & 0xFFFF == 0 else "<"
    version, n_tensors, n_kv = struct.unpack_from(order + "IQQ", data, 4)
    if version == 1:  # 32-bit counts: left to the gguf package
        return size
    if 24 + n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_BYTES > size:
        raise TruncatedCheckpointError.at(
            path, f"truncated or corrupt GGUF header ({n_tensors} tensors and {n_kv} key-value pairs do not fit "
            f"in its {size} bytes)")

    def short() -> TruncatedCheckpointError:
        return TruncatedCheckpointError.at(path, "truncated or corrupt GGUF header (a value runs past the end of "
                                           f"its {size} bytes)")

    def need(end: int) -> None:
        if end > len(data):
            raise short() if len(data) == size else _Unscanned()

    def count(at: int) -> tuple[int, int]:
        need(at + 8)
        return struct.unpack_from(order + "Q", data, at)[0], at + 8

    def value(at: int, kind: int, depth: int) -> int:
        if kind in _SCALAR_BYTES:
            at += _SCALAR_BYTES[kind]
        elif kind == 8:  # a string: its length, its bytes
            n, at = count(at)
            at += n
        elif kind == 9 and depth < _MAX_ARRAY_DEPTH:  # an array: item type, count, items
            need(at + 4)
            item = struct.unpack_from(order + "I", data, at)[0]
            n, at = count(at + 4)
            if item in _SCALAR_BYTES:
                at += n * _SCALAR_BYTES[item]
            elif n * 8 > size - at:  # every string or array item takes 8 bytes at least
                raise short()
            else:
                for _ in range(n):
                    at = value(at, item, depth + 1)
        else:
            raise CorruptCheckpointError.at(path, f"corrupt GGUF header (value type {kind})")
        if at > size:
            raise short()
        return at

    at = 24
    try:
        for _ in range(n_kv):
            n, at = count(at)  # the key
            at += n
            need(at + 4)
            at = value(at + 4, struct.unpack_from(order + "I", data, at)[0], 0)
    except _Unscanned:  # a header longer than the scan: the gguf package reads the rest
        pass
    return size


class _Unscanned(Exception):
    """The key-value section goes on past the bytes scanned."""


def _one_line(exc: BaseException) -> str:
    return clip(str(exc).split("\n")[0], 160)


def _field(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    try:
        return None if field is None else field.contents()
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _metadata(reader: Any, gguf: Any) -> dict[str, Any]:
    out = {key: value for key in (*_METADATA_KEYS, "GGUF.version") if (value := _field(reader, key)) is not None}
    if "general.file_type" in out:
        try:
            out["general.file_type"] = gguf.LlamaFileType(int(out["general.file_type"])).name
        except ValueError:
            out["general.file_type"] = int(out["general.file_type"])
    if "GGUF.version" in out:  # the last key: its place is kept
        out["gguf.version"] = int(out.pop("GGUF.version"))
    return out


class GGUFSource(TensorSource):
    """The tensors of a GGUF file or split set, dequantised one at a time; the head is ``output.weight``, or
    ``token_embd.weight`` when there is none (tied, as llama.cpp reads it)."""

    headers_only = True

    def __init__(self, path: Path, ref: str, fmt: str | None = None):
        files = split_files(path)
        self._splits = [_Split(f) for f in files]
        counts = {s.split_count for s in self._splits}
        if len(files) > 1 and counts != {len(files)}:
            raise CorruptCheckpointError.at(
                path, f"split count in the files ({sorted(c for c in counts if c is not None)}) "
                f"does not match the {len(files)} files of the set")
        names = [t[0] for s in self._splits for t in s.tensors]
        if len(set(names)) != len(names):  # one name in two splits (gguf refuses it within one): llama.cpp refuses it
            twice = next(n for n in names if names.count(n) > 1)
            where = [s.path.name for s in self._splits if any(t[0] == twice for t in s.tensors)]
            raise CorruptCheckpointError.at(path, f"tensor {twice!r} is stored twice, in {' and '.join(where)}")
        note = None
        if "output.weight" in names:
            self.head_hint = "output.weight"
        elif "token_embd.weight" in names:
            self.head_hint = "token_embd.weight"
            note = "no output.weight: the head is the token embedding, as llama.cpp reads it"
        # The file is its own description: llama.cpp's tensor order is the model's, and its names
        # (output.weight, token_embd.weight) are fixed by the format.
        arch = self._splits[0].metadata.get("general.architecture")
        self.own_description = FrameworkDescription("gguf", str(arch or "gguf"), tuple(names), self.head_hint,
                                                    note=note)
        self.provenance = Provenance(source=ref, format="gguf-split" if len(files) > 1 else "gguf",
            files=[str(f) for f in files], pending=FileDigest(files), extra={"metadata": self._splits[0].metadata})

    def __len__(self) -> int:
        return sum(len(s.tensors) for s in self._splits)

    def entries(self) -> Iterator[TensorEntry]:
        gguf = _gguf()
        for split in self._splits:
            for name, kind, dims, first, nbytes in split.tensors:
                dtype, quant = _PLAIN.get(kind), None
                if dtype is None:
                    quant = f"gguf-{kind.lower()}"
                    # A type the package cannot dequantise is named as the dtype, which the planner
                    # then skips as unsupported (it is never read).
                    dtype = "float32" if _can_dequantize(gguf, gguf.GGMLQuantizationType[kind]) else quant
                load = functools.partial(_load, split.path, kind, dims, first, nbytes)
                yield TensorEntry(name=name, shape=dims, dtype=dtype, load=load, quant=quant)


@functools.lru_cache(maxsize=None)
def _can_dequantize(gguf: Any, qtype: Any) -> bool:
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.quants.dequantize(np.zeros((1, size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _load(path: Path, kind: str, dims: tuple[int, ...], first: int, nbytes: int) -> Any:
    """One tensor's bytes (``pread``: safe from any thread), dequantised."""
    plain = _PLAIN.get(kind)
    if math.prod(dims) == 0:  # no bytes to view or dequantise (both fail on an empty buffer)
        return from_bytes(np.empty(0, dtype=np.uint8), plain or "float32", dims)
    raw = read_range(path, first, nbytes)
    if plain is not None:
        return from_bytes(raw, plain, dims)
    gguf = _gguf()
    rows = raw.reshape(*dims[:-1], -1) if len(dims) > 1 else raw
    floats: np.ndarray = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType[kind])
    return np.ascontiguousarray(floats, dtype=np.float32).reshape(dims)


GGUF = register_format(FileFormat(
    name="gguf", suffixes=(".gguf",), open=GGUFSource, sniff=lambda head, path: head[:4] == GGUF_MAGIC,
    group="other", rank=30,  # a split set counts once in a folder, as its first split
    in_folder=lambda name: (split := SPLIT_NAME.match(name)) is None or int(split["no"]) == 1))
