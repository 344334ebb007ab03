"""Safetensors: one file, or shards listed by ``*.safetensors.index.json``, read one tensor at a time; the header
is validated first, at least as strictly as by the ``safetensors`` package, and nothing past it is read until a
tensor is asked for."""

from __future__ import annotations

import functools
import json
import os
import stat
import struct
import threading
from pathlib import Path
from typing import Any, Iterator, Protocol

import numpy as np

from wbfe._deps import require_torch
from wbfe.errors import CorruptCheckpointError, SourceNotFoundError, TruncatedCheckpointError, UnsupportedDtypeError
from wbfe.linalg.arrays import from_bytes, holds_without_torch
from wbfe.sources._base import (HASH_CHUNK, FileDigest, Provenance, TensorEntry, TensorSource, file_sha256,
                                open_regular, unreadable)
from wbfe.sources._order import checkpoint_order
from wbfe.sources.registry import FileFormat, register_format

__all__ = ["SafetensorsSource", "ShardedSafetensors", "ShardReader", "read_header", "header_length", "parse_header",
           "shard_metadata", "index_weight_map", "parse_weight_map", "index_shards", "unlisted_reason", "copy_row",
           "tensor_dtype", "pinned_sha256", "changed_while_read", "SAFETENSORS_DTYPES", "MAX_INDEX", "SAFETENSORS"]

# safetensors dtype code -> (torch dtype name, bytes per element, fractional for sub-byte types).
SAFETENSORS_DTYPES: dict[str, tuple[str, float]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1), "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1), "F8_E8M0": ("float8_e8m0fnu", 1),
    "F6_E2M3": ("float6_e2m3", 0.75), "F6_E3M2": ("float6_e3m2", 0.75), "F4": ("float4_e2m1", 0.5),
    "C64": ("complex64", 8)}
_DTYPE_BITS = {code: round(size * 8) for code, (_, size) in SAFETENSORS_DTYPES.items()}
_MAX_HEADER = 100_000_000  # the safetensors format's own limit
_U64 = 1 << 64
MAX_INDEX = 100_000_000  # a shard index of 10^6 tensors is ~100 MB


def read_header(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """``(tensors, metadata)``: per-tensor ``dtype``/``shape``/``data_offsets`` in file order, and ``__metadata__``,
    validated at least as strictly as by the ``safetensors`` package: a UTF-8 JSON object with unique keys, known
    dtypes, offsets that span each tensor's bytes exactly and tile the data section, string metadata.

    Raises:
        TruncatedCheckpointError: the file ends before its header or its last tensor.
        CorruptCheckpointError: the header is not valid safetensors, or the path is not a regular file.
        SourceNotFoundError: the file cannot be read.
    """
    return _pinned_header(path)[:2]


def _pinned_header(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str], tuple[int, ...]]:
    """:func:`read_header`'s answer and the ``_identity`` of the file it was read from."""
    with open_regular(path) as fh:
        try:
            st = os.fstat(fh.fileno())
            n = header_length(fh.read(8), st.st_size, str(path))
            raw = fh.read(n)
        except OSError as exc:
            raise unreadable(path, exc) from None
    if len(raw) != n:
        raise TruncatedCheckpointError.at(path, "truncated safetensors file (short read)")
    return (*parse_header(raw, st.st_size, str(path)), _identity(st))


def header_length(prefix: bytes, size: int, where: str) -> int:
    """The header length a safetensors file of ``size`` bytes declares in its first 8 bytes ``prefix``.

    Raises:
        TruncatedCheckpointError: fewer than 8 bytes, or a header that would run past the end.
        CorruptCheckpointError: a length beyond the format's limit.
    """
    if len(prefix) < 8:
        raise TruncatedCheckpointError.at(where, f"truncated safetensors file ({size} bytes, no header)")
    (n,) = struct.unpack("<Q", prefix[:8])
    # The header length is the file's first 8 bytes: never print it (a foreign file's bytes).
    if n > _MAX_HEADER:
        raise CorruptCheckpointError.at(where, "not a safetensors file (its first 8 bytes are not a header length)")
    if 8 + n > size:
        raise TruncatedCheckpointError.at(
            where, f"truncated safetensors file, or not one (its header would run past the end of its {size} bytes)")
    return int(n)


def shard_metadata(shards: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
    """The ``__metadata__`` of ``(shard name, metadata)`` as one mapping: a key keeps its value where every shard
    holding it agrees, and maps each shard to its own value where they differ (a merge showed one shard's value as
    every shard's)."""
    values: dict[str, dict[str, str]] = {}
    for name, meta in shards:
        for key, value in meta.items():
            values.setdefault(key, {})[name] = value
    return {key: next(iter(by.values())) if len(set(by.values())) == 1 else by for key, by in values.items()}


def parse_header(raw: bytes, size: int, where: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Validate the header bytes ``raw`` of a safetensors file of ``size`` bytes (as :func:`read_header`)."""
    header = _parse_json(raw, "corrupt safetensors header", where)
    if not isinstance(header, dict):
        raise CorruptCheckpointError.at(where, "corrupt safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None)  # null is allowed
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise CorruptCheckpointError.at(where, "corrupt safetensors header (__metadata__ must map strings to strings)")
    tensors = {name: _tensor_info(where, name, info) for name, info in header.items()}
    ordered = dict(sorted(tensors.items(), key=lambda kv: tuple(kv[1]["data_offsets"])))
    data_size = size - 8 - len(raw)
    position = 0
    for name, info in ordered.items():
        start, end = info["data_offsets"]
        if start != position:
            what = "overlaps the tensor before it" if start < position else "leaves a gap before it"
            raise CorruptCheckpointError.at(where, f"corrupt safetensors header (the data of tensor {name!r} {what})")
        position = end
    if position > data_size:
        raise TruncatedCheckpointError.at(where, f"truncated safetensors file (tensor data needs {position} bytes "
                                          f"after the header, file has {data_size})")
    if position < data_size:
        raise CorruptCheckpointError.at(
            where, f"corrupt safetensors header (its tensors cover {position} of the {data_size} data bytes)")
    return ordered, dict(metadata or {})


def _parse_json(raw: bytes, what: str, path: Path | str) -> Any:
    """JSON as the format allows it: UTF-8, unique keys, no NaN/Infinity or lone surrogates, bounded nesting."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        # The codec's message quotes the offending byte: never echo a file's bytes.
        raise CorruptCheckpointError.at(path, f"{what} (not UTF-8 text)") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise CorruptCheckpointError.at(path, f"{what} (JSONDecodeError: {exc.msg} at character {exc.pos})") from None
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise CorruptCheckpointError.at(path, f"{what} ({reason})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key[:80]!r} appears twice")
        out[key] = value
    try:
        for text in (*out, *(value for value in out.values() if isinstance(value, str))):
            text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a string holds an unpaired surrogate escape") from None
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < _U64


def _tensor_info(path: Path | str, name: str, info: Any) -> dict[str, Any]:
    def bad(reason: str) -> CorruptCheckpointError:
        return CorruptCheckpointError.at(path, f"corrupt safetensors header ({reason} for tensor {name[:200]!r})")

    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise bad("expected an object with dtype, shape and data_offsets")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise bad(f"unknown dtype {str(dtype)[:40]!r}" if isinstance(dtype, str) else "dtype is not a string")
    if not isinstance(shape, list) or not all(_is_count(s) for s in shape):
        raise bad("shape is not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise bad("data_offsets is not two non-negative integers")
    start, end = offsets
    numel = 1
    for s in shape:
        numel *= s
        if numel >= _U64:
            raise bad("shape has more than 2^64 elements")
    bits = numel * _DTYPE_BITS[dtype]
    if end < start or bits % 8 or bits // 8 != end - start:
        raise bad("data_offsets do not match its shape and dtype")
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [start, end]}


def index_shards(index_path: Path) -> list[tuple[Path, list[str]]]:
    """The shards of a ``*.index.json`` shard index as ``(path, tensor names)``, each file once, in first-listed
    order. Shard names are normalised and must name a regular file (or a symlink to one) inside the index's folder.

    Raises:
        CorruptCheckpointError: not valid JSON, no ``weight_map``, a shard name that leaves the
            folder, or a shard that is not a regular file.
        SourceNotFoundError: a listed shard is missing, or the index cannot be read.
    """
    shards = index_weight_map(index_path)
    folder = index_path.parent
    for shard in shards:
        parts = shard.split("/")
        try:
            for i in range(1, len(parts)):
                if not stat.S_ISDIR(os.lstat(folder.joinpath(*parts[:i])).st_mode):
                    raise CorruptCheckpointError.at(
                        index_path, f"shard {shard!r} is reached through {'/'.join(parts[:i])!r}, which is not a "
                        "folder of the checkpoint (a symlink or a file)")
            mode = os.stat(folder / shard).st_mode
        except FileNotFoundError:
            raise SourceNotFoundError.at(index_path, f"shard {shard!r} listed in the index is missing") from None
        except OSError as exc:
            raise unreadable(folder / shard, exc) from None
        if not stat.S_ISREG(mode):
            raise CorruptCheckpointError.at(index_path, f"shard {shard!r} listed in the index is not a regular file")
    return [(folder / shard, names) for shard, names in shards.items()]


def index_weight_map(index_path: Path) -> dict[str, list[str]]:
    """Shard name -> tensor names, in index order, as :func:`index_shards` reads them but without looking for
    the shards (which may not be downloaded yet)."""
    with open_regular(index_path) as fh:
        try:
            raw = fh.read(MAX_INDEX + 1)
        except OSError as exc:
            raise unreadable(index_path, exc) from None
    return parse_weight_map(raw, str(index_path))


def parse_weight_map(raw: bytes, where: str) -> dict[str, list[str]]:
    """The shards of the index whose bytes are ``raw`` (local or remote), as :func:`index_weight_map` gives them."""
    if len(raw) > MAX_INDEX:
        raise CorruptCheckpointError.at(where, f"shard index larger than {MAX_INDEX} bytes")
    index = _parse_json(raw, "corrupt shard index", where)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CorruptCheckpointError.at(where, "corrupt shard index (expected JSON with a 'weight_map' object)")
    if not weight_map:  # its shards would go unread, and the checkpoint's digest be that of no file
        raise CorruptCheckpointError.at(where, "corrupt shard index (its 'weight_map' lists no tensor)")
    shards: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str):
            raise CorruptCheckpointError.at(
                where, f"corrupt shard index (the shard of tensor {tensor[:200]!r} is not a file name)")
        parts = [p for p in shard.split("/") if p not in ("", ".")]  # normalised, and inside the index's folder
        if shard.startswith("/") or "\\" in shard or "\0" in shard or ".." in parts or not parts:
            raise CorruptCheckpointError.at(
                where, f"shard {shard[:200]!r} is not a file name inside the checkpoint's folder")
        shards.setdefault("/".join(parts), []).append(tensor)
    return shards


def unlisted_reason(shards: list[str], index_name: str) -> str:
    """Why a tensor that ``shards`` hold but the index does not list is skipped (wbfe scores what the index lists)."""
    return (f"in shard{'s' if len(shards) > 1 else ''} {', '.join(shards)} but not listed in {index_name}: "
            "not part of the checkpoint its index describes")


def copy_row(name: str, shard: str, owner: str, holders: list[str], index_name: str) -> tuple[str, str]:
    """``(row name, reason)`` of the copy of ``name`` that ``shard`` holds although the index gives ``name`` to
    ``owner`` (whose copy is scored); ``holders``: every shard holding it. The row is named ``shard/name``, so that
    it is one row of its own, as another state dict's tensor is, beside the scored ``name``."""
    # transformers merges the shards' tensors in file name order, whatever the index says: the last copy wins
    last = max(holders)
    loader = ("transformers' loader takes that one too" if last == owner else
              f"transformers' loader takes {'this one' if last == shard else f'the one in {last}'} instead: it reads "
              "every shard's tensors in file name order, the last copy winning")
    return f"{shard}/{name}", (f"a second copy of {name!r}: {index_name} gives it to {owner}, whose copy is scored "
                               f"({loader})")


class ShardReader(Protocol):
    def read(self, info: dict[str, Any]) -> Any: ...

    def close(self) -> None: ...


class ShardedSafetensors(TensorSource):
    """The tensors of safetensors shards whose headers are read, in checkpoint order, each read by a
    :class:`ShardReader` when asked for: a subclass gives the headers (:meth:`plan`) and opens a shard."""

    headers_only = True

    def plan(self, shards: list[tuple[Any, str, list[str] | None, dict[str, dict[str, Any]]]], index_name: str) -> None:
        """The reading plan from ``(key for open_shard, shard name, tensors its index lists or None, header)``
        per shard (``CorruptCheckpointError`` for a listed tensor missing from its shard)."""
        # Per shard: its key and (row name, header name, why it is skipped) per tensor.
        self._plan: list[tuple[Any, list[tuple[str, str, str | None]], dict[str, dict[str, Any]]]] = []
        # Tensors a shard holds but its index does not list: listed as skipped, once a name, not dropped unseen.
        self._unlisted: dict[str, list[str]] = {}
        self._index_name = index_name
        self._handles: list[ShardReader] = []
        owner = {name: shard_name for _, shard_name, listed, _ in shards for name in listed or ()}
        holders: dict[str, list[str]] = {}
        for _, shard_name, _, header in shards:
            for name in header:
                holders.setdefault(name, []).append(shard_name)
        for key, shard_name, listed, header in shards:
            names = checkpoint_order(list(header), lambda name: header[name]["dtype"])
            if listed is None:
                self._plan.append((key, [(name, name, None) for name in names], header))
                continue
            missing = next((t for t in listed if t not in header), None)
            if missing is not None:
                raise CorruptCheckpointError.at(key, f"tensor {missing!r} listed in the index is not in this shard")
            unlisted = [name for name in names if name not in owner and name not in self._unlisted]
            for name in names:
                if name not in owner:
                    self._unlisted.setdefault(name, []).append(shard_name)
            rows: list[tuple[str, str, str | None]] = [(n, n, None) for n in checkpoint_order(listed) + unlisted]
            for name in names:  # a name the index gives to another shard: this copy is a skipped row of its own
                if name in owner and owner[name] != shard_name:
                    row, why = copy_row(name, shard_name, owner[name], holders[name], index_name)
                    rows.append((row, name, why))
            self._plan.append((key, rows, header))

    def open_shard(self, key: Any) -> ShardReader:
        raise NotImplementedError

    def __len__(self) -> int:
        return sum(len(names) for _, names, _ in self._plan)

    def entries(self) -> Iterator[TensorEntry]:
        return self.described(self._entries())

    def _entries(self) -> Iterator[TensorEntry]:
        for key, names, header in self._plan:
            shard = self.open_shard(key)
            self._handles.append(shard)
            try:
                for row, name, why in names:
                    info = header[name]
                    shards_unlisted = self._unlisted.get(name)
                    load = functools.partial(shard.read, info)
                    yield TensorEntry(name=row, shape=tuple(int(s) for s in info["shape"]),
                        dtype=SAFETENSORS_DTYPES[info["dtype"]][0], load=load, copy_of=None if row == name else name,
                        skip=why or (unlisted_reason(shards_unlisted, self._index_name) if shards_unlisted else None))
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


class SafetensorsSource(ShardedSafetensors):
    """Tensors of one ``.safetensors`` file or of the shards of a ``*.safetensors.index.json``, read one at a time."""

    def __init__(self, path: Path, ref: str, fmt: str | None = None):
        index = path if path.name.lower().endswith(".index.json") else None
        shards: list[tuple[Path, list[str] | None]] = list(index_shards(path)) if index else [(path, None)]
        files = [shard for shard, _ in shards]
        headers = [_pinned_header(shard) for shard in files]
        # Shards are opened one after another as the scoring reaches them: each must still be the file whose
        # header planned its reads (a checkpoint re-saved in place meanwhile would give other bytes).
        self._identities = {shard: identity for shard, (_, _, identity) in zip(files, headers)}
        # Shards as the index names them: two in subfolders may share a file name
        named = [shard.relative_to(path.parent).as_posix() if index else shard.name for shard in files]
        self.plan([(shard, name, listed, header) for (shard, listed), name, (header, _, _) in zip(shards, named, headers)],
                  index.name if index else "")
        metadata = shard_metadata([(name, meta) for name, (_, meta, _) in zip(named, headers)])
        self.provenance = Provenance(source=ref, format=fmt or ("safetensors-sharded" if index else "safetensors"),
            files=[str(p) for p in ([index] if index else []) + files], pending=FileDigest(files),
            extra={"metadata": metadata} if metadata else {})

    def open_shard(self, key: Any) -> ShardReader:
        return _Shard(key, self._identities[key])

    def pins(self) -> dict[str, tuple[int, ...]]:
        """Each shard's size and modification time when its header was read: what another process (a Ray task)
        checks it reads the same files by (its device and inode numbers are its own mount's)."""
        return {str(path): identity[2:] for path, identity in self._identities.items()}


def pinned_sha256(path: Path, pin: tuple[int, ...]) -> str:
    """The SHA-256 of the shard ``path``, which is still the file :meth:`SafetensorsSource.pins` gave as ``pin``
    before and after it is hashed (``CorruptCheckpointError`` otherwise)."""
    def check() -> None:
        try:
            same = _identity(os.stat(path))[2:] == pin
        except OSError as exc:
            raise unreadable(path, exc) from None
        if not same:
            raise changed_while_read(path)

    check()
    digest = file_sha256(path, bytearray(HASH_CHUNK))[1]
    check()
    return digest


def changed_while_read(path: Path | str) -> CorruptCheckpointError:
    return CorruptCheckpointError.at(path, "changed while being read (replaced or rewritten since its header was "
                                     "read); score it again")


class _Shard:
    """One open safetensors file whose tensors may be read from any thread, in any order, and after it is closed."""

    def __init__(self, path: Path, identity: tuple[int, ...]):
        self.path = path
        self._fh = open_regular(path)
        try:
            self._identity = _identity(os.fstat(self._fh.fileno()))
            self._data_start = 8 + struct.unpack("<Q", self._fh.read(8))[0]
        except (OSError, struct.error) as exc:
            self._fh.close()
            raise CorruptCheckpointError.at(path, f"changed while being read ({exc.__class__.__name__})") from None
        if self._identity != identity:  # ``identity``: the file's when its header was read
            self._fh.close()
            raise changed_while_read(path)
        self._lock = threading.Lock()  # seek + read on one handle must not interleave

    def read(self, info: dict[str, Any]) -> Any:
        try:
            with self._lock:
                if not self._fh.closed:
                    return _load_tensor(self._fh, self._data_start, info, self._identity)
            with open_regular(self.path) as fh:
                return _load_tensor(fh, self._data_start, info, self._identity)
        except OSError as exc:
            raise unreadable(self.path, exc) from None

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _load_tensor(fh: Any, data_start: int, info: dict[str, Any], identity: tuple[int, ...]) -> Any:
    """One tensor of the file whose ``_identity`` was ``identity`` when it was opened, read into a buffer of its own."""
    name = tensor_dtype(info, str(fh.name))
    shape = [int(s) for s in info["shape"]]
    start, end = (int(o) for o in info["data_offsets"])
    if end == start:
        return from_bytes(np.empty(0, dtype=np.uint8), name, shape)
    st = os.fstat(fh.fileno())
    if st.st_size < data_start + end:  # cut short since its header was checked
        raise TruncatedCheckpointError.at(fh.name, "truncated safetensors file (it changed while being read)")
    if _identity(st) != identity:  # replaced or rewritten: the header's offsets would read other bytes
        raise CorruptCheckpointError.at(fh.name, "changed while being read (replaced or rewritten since it was "
                                        "opened); score it again")
    # np.empty, not bytearray: a bytearray is zero-filled first, a second pass over every byte
    raw = np.empty(end - start, dtype=np.uint8)
    fh.seek(data_start + start)
    if fh.readinto(raw.data) != end - start:
        raise TruncatedCheckpointError.at(fh.name, "truncated safetensors file (short read)")
    return from_bytes(raw, name, shape)


def tensor_dtype(info: dict[str, Any], where: str) -> str:
    """wbfe's dtype name of a header entry ``info`` of the file ``where``, checked to be one numpy or this
    torch holds (``UnsupportedDtypeError``, ``MissingDependencyError`` otherwise)."""
    name = SAFETENSORS_DTYPES[info["dtype"]][0]
    if holds_without_torch(name):
        return name
    require_torch(f"{where}: reading {info['dtype']} tensors (numpy has no {name})")
    import torch

    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise UnsupportedDtypeError.at(where, f"this torch ({torch.__version__}) has no {info['dtype']} tensors, "
                                       "which the file stores", dtype=info["dtype"])
    return name


SAFETENSORS = register_format(FileFormat(name="safetensors", suffixes=(".safetensors",), open=SafetensorsSource,
    index_suffixes=(".safetensors.index.json",), preferred="model.safetensors", group="safetensors", rank=10))
