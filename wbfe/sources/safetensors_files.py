"""Safetensors: one file, or shards listed by ``*.safetensors.index.json``, read one tensor at a time.

wbfe validates the header itself, so a corrupt or truncated file gets a precise one-line error
naming the file before any work, and nothing past the header is read until a tensor is asked for.
Each tensor is then mapped on its own (see :func:`_map_tensor`), or read where it cannot be.
"""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import os
import struct
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from wbfe.errors import CorruptCheckpointError, SourceNotFoundError, TruncatedCheckpointError
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource
from wbfe.sources._order import checkpoint_order

if TYPE_CHECKING:
    import torch

__all__ = ["SafetensorsSource", "read_header", "read_index", "SAFETENSORS_DTYPES"]

# safetensors dtype code -> (torch dtype name, bytes per element); sub-byte types have 0 and are
# accepted by the header check without a size test.
SAFETENSORS_DTYPES: dict[str, tuple[str, float]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U64": ("uint64", 8),
    "U32": ("uint32", 4),
    "U16": ("uint16", 2),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "F6_E2M3": ("float6_e2m3", 0),
    "F6_E3M2": ("float6_e3m2", 0),
    "F4": ("float4_e2m1", 0),
    "C64": ("complex64", 8),
}
_MAX_HEADER = 100_000_000  # the safetensors format's own limit
# Smaller tensors are read: a map, its page table and its unmapping cost more than reading a few
# pages (CIFAR ResNet-56's 277 tensors: 3.4 ms mapped, 2.2 ms read, and more when freed).
_MAP_BYTES = 1 << 20
# madvise(MADV_POPULATE_READ) (Linux >= 5.14; Python < 3.13 lacks the name): fill a mapping's page
# table from the page cache, reading from disk what is not there, in one call.
_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22 if sys.platform == "linux" else None)


def read_header(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Parse and validate a safetensors header.

    Returns:
        ``(tensors, metadata)``: per-tensor ``dtype``/``shape``/``data_offsets`` in file order,
        and the free-form ``__metadata__`` string map.

    Raises:
        TruncatedCheckpointError: the file ends before its header or its last tensor.
        CorruptCheckpointError: the header is not valid safetensors.
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise TruncatedCheckpointError(
                f"{path}: truncated safetensors file ({size} bytes, no header)", path=str(path)
            )
        (n,) = struct.unpack("<Q", prefix)
        if n > _MAX_HEADER:
            raise CorruptCheckpointError(
                f"{path}: not a safetensors file (header length {n} is impossible)", path=str(path)
            )
        if 8 + n > size:
            raise TruncatedCheckpointError(
                f"{path}: truncated safetensors file (header needs {8 + n} bytes, file has {size})",
                path=str(path),
            )
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(
            f"{path}: corrupt safetensors header ({exc.__class__.__name__}: {exc})", path=str(path)
        ) from None
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"{path}: corrupt safetensors header (not a JSON object)", path=str(path))
    metadata = header.pop("__metadata__", None) or {}
    data_size = size - 8 - n
    end_max = 0
    for name, info in header.items():
        try:
            dtype = info["dtype"]
            shape = [int(s) for s in info["shape"]]
            start, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CorruptCheckpointError(
                f"{path}: corrupt safetensors header (bad entry for tensor {name!r})", path=str(path)
            ) from None
        if dtype not in SAFETENSORS_DTYPES:
            raise CorruptCheckpointError(
                f"{path}: corrupt safetensors header (unknown dtype {dtype!r} for tensor {name!r})",
                path=str(path),
            )
        numel = 1
        for s in shape:
            numel *= s
        itemsize = SAFETENSORS_DTYPES[dtype][1]
        if start < 0 or end < start or (itemsize and numel * itemsize != end - start):
            raise CorruptCheckpointError(
                f"{path}: corrupt safetensors header (offsets of tensor {name!r} do not match its shape)",
                path=str(path),
            )
        end_max = max(end_max, end)
    if end_max > data_size:
        raise TruncatedCheckpointError(
            f"{path}: truncated safetensors file (tensor data needs {end_max} bytes after the header, "
            f"file has {data_size})",
            path=str(path),
        )
    ordered = dict(sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]))
    return ordered, {str(k): str(v) for k, v in dict(metadata).items()}


def read_index(index_path: Path) -> dict[str, list[str]]:
    """Read a ``*.index.json`` shard index: shard file name -> tensor names, in index order.

    Raises:
        CorruptCheckpointError: not valid JSON or no ``weight_map``.
        SourceNotFoundError: a listed shard is missing.
    """
    try:
        index = json.loads(index_path.read_text())
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise CorruptCheckpointError(
            f"{index_path}: corrupt shard index (expected JSON with a 'weight_map' object)",
            path=str(index_path),
        ) from None
    shards: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        shards.setdefault(str(shard), []).append(str(tensor))
    for shard in shards:
        if not (index_path.parent / shard).is_file():
            raise SourceNotFoundError(
                f"{index_path}: shard {shard!r} listed in the index is missing", path=str(index_path)
            )
    return shards


class SafetensorsSource(TensorSource):
    """Tensors of one safetensors file or of the shards of an index, read one at a time."""

    def __init__(self, ref: str, files: list[Path], *, index: Path | None = None, fmt: str | None = None):
        self._plan: list[tuple[Path, list[str], dict[str, dict[str, Any]]]] = []
        wanted = read_index(index) if index is not None else None
        metadata: dict[str, str] = {}
        for path in files:
            header, meta = read_header(path)
            metadata.update(meta)
            names = checkpoint_order(list(header), lambda name: header[name]["dtype"])
            if wanted is not None:
                listed = wanted.get(path.name, [])
                missing = [t for t in listed if t not in header]
                if missing:
                    raise CorruptCheckpointError(
                        f"{path}: tensor {missing[0]!r} listed in the index is not in this shard",
                        path=str(path),
                    )
                names = checkpoint_order(listed)
            self._plan.append((path, names, header))
        all_files = ([index] if index is not None else []) + list(files)
        self.provenance = Provenance(
            source=ref,
            format=fmt or ("safetensors-sharded" if index is not None else "safetensors"),
            files=[str(p) for p in all_files],
            pending=FileDigest(files),
            extra={"metadata": metadata} if metadata else {},
        )
        self._handles: list[Any] = []

    def __len__(self) -> int:
        return sum(len(names) for _, names, _ in self._plan)

    def entries(self) -> Iterator[TensorEntry]:
        for path, names, header in self._plan:
            shard = _Shard(path)
            self._handles.append(shard)
            try:
                for name in names:
                    info = header[name]
                    load = functools.partial(shard.read, info)
                    yield TensorEntry(
                        name=name,
                        shape=tuple(int(s) for s in info["shape"]),
                        dtype=SAFETENSORS_DTYPES[info["dtype"]][0],
                        load=load,
                        reread=load,
                    )
            finally:
                # Shards are closed as soon as they are done so handles do not accumulate.
                shard.close()
                if shard in self._handles:  # close() may have cleared them first
                    self._handles.remove(shard)

    def close(self) -> None:
        super().close()
        for shard in self._handles:
            shard.close()
        self._handles.clear()


class _Shard:
    """One open safetensors file whose tensors may be read from any thread, in any order, and after
    it is closed (then from a handle of their own): a read-ahead thread and tie checks read too."""

    def __init__(self, path: Path):
        self.path = path
        self._fh = open(path, "rb")
        self._data_start = 8 + struct.unpack("<Q", self._fh.read(8))[0]
        self._lock = threading.Lock()  # seek + read on one handle must not interleave

    def read(self, info: dict[str, Any]) -> "torch.Tensor":
        with self._lock:
            if not self._fh.closed:
                return _load_tensor(self._fh, self._data_start, info)
        with open(self.path, "rb") as fh:
            return _load_tensor(fh, self._data_start, info)

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def _load_tensor(fh: Any, data_start: int, info: dict[str, Any]) -> "torch.Tensor":
    """One tensor of the file: a large one mapped where the file can be mapped at an aligned
    address, anything else read."""
    import torch

    dtype = getattr(torch, SAFETENSORS_DTYPES[info["dtype"]][0])
    shape = [int(s) for s in info["shape"]]
    start, end = (int(o) for o in info["data_offsets"])
    if end == start:
        return torch.empty(shape, dtype=dtype)
    if os.fstat(fh.fileno()).st_size < data_start + end:  # cut short since its header was checked
        raise TruncatedCheckpointError(f"{fh.name}: truncated safetensors file (it changed while being read)",
                                       path=str(fh.name))
    raw = None
    if end - start >= _MAP_BYTES and (data_start + start) % dtype.itemsize == 0:
        with contextlib.suppress(OSError):  # a file system that cannot map files: read instead
            raw = _map_tensor(fh, data_start + start, end - start)
    if raw is None:
        raw = _read_tensor(fh, data_start + start, end - start)
    return raw.view(dtype).reshape(shape)


def _map_tensor(fh: Any, first: int, nbytes: int) -> "torch.Tensor":
    """The bytes ``[first, first + nbytes)`` of the file, mapped copy-on-write, page table filled.

    Reading into a buffer of its own cost 40 ms for a 94 MB tensor, all of it before any work on
    the first tensor (fresh pages are faulted in and zeroed, then copied into); a filled map of the
    same bytes takes 2 ms. One map per tensor, unmapped when the tensor is freed, so the resident
    set is the tensors alive now, as with a read (a map of the whole file would keep every page
    read so far counted until it was closed). Copy-on-write, as the tensor must be writable for
    torch, though nothing writes it.
    """
    import torch

    offset = first - first % mmap.ALLOCATIONGRANULARITY
    mapped = mmap.mmap(fh.fileno(), first + nbytes - offset, access=mmap.ACCESS_COPY, offset=offset)
    if _POPULATE_READ is not None:
        with contextlib.suppress(OSError):  # an older kernel: pages are faulted in as first read
            mapped.madvise(_POPULATE_READ)
    return torch.frombuffer(mapped, dtype=torch.uint8, offset=first - offset, count=nbytes)


def _read_tensor(fh: Any, first: int, nbytes: int) -> "torch.Tensor":
    """The bytes ``[first, first + nbytes)`` of the file, read into a buffer of their own."""
    import torch

    # torch.empty, not bytearray: a bytearray is zero-filled first, a second pass over every byte.
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    fh.seek(first)
    if fh.readinto(buffer.numpy().data) != nbytes:
        raise TruncatedCheckpointError(f"{fh.name}: truncated safetensors file (short read)", path=str(fh.name))
    return buffer
