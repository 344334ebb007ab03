"""Flax checkpoints (``flax_model.msgpack``, ``flax.serialization.to_bytes``), parsed whole with ``msgpack`` alone;
arrays are reported in PyTorch's layout and names, as transformers' Flax-to-PyTorch conversion gives them."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from wbfe._deps import require
from wbfe.errors import CorruptCheckpointError, TruncatedCheckpointError
from wbfe.linalg.arrays import NUMPY_DTYPES, from_bytes, is_torch
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource, open_regular, stored_bytes
from wbfe.sources.numpy_files import numpy_dtype_name
from wbfe.sources.registry import FileFormat, register_format

__all__ = ["FlaxSource", "FLAX", "torch_name", "torch_layout"]

_NDARRAY, _NPSCALAR = 1, 3
_CHUNKED = "__msgpack_chunked_array__"
_COLLECTIONS = ("params", "batch_stats")
_OPTIMIZER = ("opt_state", "optimizer", "optimizer_state")
_RENAMED = {"kernel": "weight", "scale": "weight", "embedding": "weight", "mean": "running_mean", "var": "running_var"}


def _msgpack() -> Any:
    return require("msgpack", "reading Flax checkpoints needs msgpack: pip install 'wbfe[flax]'")


@dataclass(frozen=True)
class _Array:
    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[bytes | memoryview, ...]


@dataclass(frozen=True)
class _Leaf:
    name: str
    array: Optional[_Array]
    permute: Optional[tuple[int, ...]]
    skip: Optional[str]
    matrix: Optional[tuple[int, int]] = None  # the 2-D shape a permuted DenseGeneral kernel is read in


def torch_name(path: tuple[str, ...]) -> str:
    """The PyTorch name of the Flax variable at ``path`` (collection prefix dropped, last key renamed)."""
    keys = list(path[1:] if len(path) > 1 and path[0] in _COLLECTIONS else path)
    if keys and keys[-1] in _RENAMED:
        keys[-1] = _RENAMED[keys[-1]]
    return ".".join(keys)


def torch_layout(last_key: str, ndim: int) -> Optional[tuple[int, ...]]:
    """The permutation from a Flax ``kernel`` (k… × in × out) to PyTorch's out × in × k…; None for others."""
    if last_key != "kernel" or ndim < 2:
        return None
    return (ndim - 1, ndim - 2, *range(ndim - 2))


def _ext_hook(code: int, data: bytes) -> Any:
    """msgpack's hook for extension types: arrays (1) and numpy scalars (3) as ``_Array``."""
    msgpack = _msgpack()
    if code not in (_NDARRAY, _NPSCALAR):
        return msgpack.ExtType(code, data)
    shape, dtype, buffer = msgpack.unpackb(data, raw=True)
    if not isinstance(shape, (list, tuple)) or not all(isinstance(s, int) and s >= 0 for s in shape) \
            or not isinstance(dtype, bytes) or not isinstance(buffer, bytes):
        raise ValueError("an array record that is not (shape, dtype, bytes)")
    array = _Array(tuple(shape), dtype.decode("ascii"), (buffer,))
    return array if code == _NDARRAY else ("scalar", array)


class FlaxSource(TensorSource):
    """The arrays of a Flax msgpack checkpoint, in PyTorch's layout and names."""

    def __init__(self, path: Path, ref: str, fmt: Optional[str] = None):
        msgpack = _msgpack()
        self._path = path
        with open_regular(path) as fh:
            raw = fh.read()
        try:
            tree = msgpack.unpackb(raw, ext_hook=_ext_hook, raw=False, strict_map_key=False)
        except (msgpack.UnpackException, ValueError, TypeError, RecursionError) as exc:
            if isinstance(exc, msgpack.OutOfData) or "incomplete input" in str(exc):
                raise TruncatedCheckpointError.at(path, "truncated Flax msgpack file") from None
            raise CorruptCheckpointError.at(path, f"not a readable Flax msgpack file ({exc.__class__.__name__}: "
                                            f"{str(exc)[:80]})") from None
        del raw
        if not isinstance(tree, dict):
            raise CorruptCheckpointError.at(path, "not a Flax checkpoint (the top level is no map)")
        self._leaves = self._flatten(tree)
        if not self._leaves:
            raise CorruptCheckpointError.at(path, "a Flax msgpack file with no arrays")
        self.provenance = Provenance(source=ref, format="flax-msgpack", files=[str(path)], pending=FileDigest([path]))

    def _flatten(self, tree: dict[Any, Any]) -> list[_Leaf]:
        items: list[tuple[tuple[str, ...], Any]] = []
        stack: list[tuple[tuple[str, ...], Any]] = [((), tree)]
        while stack:
            path, value = stack.pop()
            # The marker's presence, whatever its value, makes a chunked array, as flax's restore has it
            # (found by fuzzing: a false marker read the chunks as arrays of their own).
            if isinstance(value, dict) and _CHUNKED in value:
                value = self._unchunk(path, value)
            if isinstance(value, (dict, list)):  # a list's items named by index, as flax's to_state_dict names them
                children = value.items() if isinstance(value, dict) else enumerate(value)
                stack += [((*path, str(k)), v) for k, v in reversed(list(children))]
            elif isinstance(value, _Array) or (isinstance(value, tuple) and len(value) == 2 and value[0] == "scalar"):
                items.append((path, value))  # else a step count, a flag: not a tensor
        stacked = _scanned(items)
        paths = {p for p, _ in items}
        out: list[_Leaf] = []
        done: set[tuple[str, ...]] = set()
        for path, value in items:
            block = next((path[:k] for k in range(1, len(path)) if path[:k] in stacked), None)
            if block is None:
                out.append(_Leaf(".".join(path), None, None, "a numpy scalar, not an array")
                           if isinstance(value, tuple) else self._leaf(path, value, _attention(path, paths)))
            elif block not in done:  # the scanned block's layers one after another, as the scan runs them
                done.add(block)
                members = [(p, a) for p, a in items if p[:len(block)] == block]
                for p, a in members:
                    self._leaf(p, a)  # the stacked array's size checked whole
                layers = {p: _layers(a) for p, a in members}
                out += [self._leaf((*block, str(i), *p[len(block):]), layers[p][i], _attention(p, paths))
                        for i in range(stacked[block]) for p, _ in members]
        names: set[str] = set()
        for leaf in out:
            if leaf.name in names:
                raise CorruptCheckpointError.at(self._path, f"two arrays are both named {leaf.name!r}")
            names.add(leaf.name)
        return out

    def _leaf(self, path: tuple[str, ...], array: _Array, inputs: Optional[int] = None) -> _Leaf:
        name = torch_name(path)
        dtype = _dtype(array.dtype)
        if dtype is None:
            return _Leaf(name, array, None, f"{array.dtype} array: not a weight dtype")
        need, have = stored_bytes(array.shape, dtype), sum(len(p) for p in array.pieces)
        if have != need:
            raise CorruptCheckpointError.at(self._path, f"array {'.'.join(path)!r} holds {have} bytes, its shape "
                                            f"needs {need}")
        skip = "optimizer state" if path and path[0] in _OPTIMIZER else None
        shape = array.shape
        if inputs is not None and len(shape) >= 3:  # out × in: the output axes, then the input axes, flattened
            return _Leaf(name, array, (*range(inputs, len(shape)), *range(inputs)), skip,
                         (math.prod(shape[inputs:]), math.prod(shape[:inputs])))
        return _Leaf(name, array, torch_layout(path[-1] if path else "", len(shape)), skip)

    def _unchunk(self, path: tuple[str, ...], value: dict[Any, Any]) -> _Array:
        try:
            shape = tuple(int(value["shape"][str(i)]) for i in range(len(value["shape"])))
            chunks = [value["chunks"][str(i)] for i in range(len(value["chunks"]))]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CorruptCheckpointError.at(self._path, f"chunked array {'.'.join(path)!r} is malformed") from None
        if not chunks or not all(isinstance(c, _Array) and c.dtype == chunks[0].dtype for c in chunks):
            raise CorruptCheckpointError.at(self._path, f"chunked array {'.'.join(path)!r} has no or mixed chunks")
        return _Array(shape, chunks[0].dtype, tuple(p for c in chunks for p in c.pieces))

    def __len__(self) -> int:
        return len(self._leaves)

    def entries(self) -> Iterator[TensorEntry]:
        for leaf in self._leaves:
            array = leaf.array
            shape = array.shape if array is not None else ()
            if leaf.permute is not None:
                shape = leaf.matrix or tuple(shape[i] for i in leaf.permute)
            dtype = (_dtype(array.dtype) or array.dtype) if array is not None else "float32"
            yield TensorEntry(name=leaf.name, shape=shape, dtype=dtype, load=functools.partial(_load, leaf),
                              skip=leaf.skip)


def _attention(path: tuple[str, ...], paths: set[tuple[str, ...]]) -> Optional[int]:
    """How many leading input axes the DenseGeneral ``kernel`` at ``path`` has, where it is a projection of flax's
    MultiHeadDotProductAttention (siblings query, key, value, out): 1 for query/key/value (d, heads, head_dim),
    2 for out (heads, head_dim, d); None for any other array."""
    if len(path) < 3 or path[-1] != "kernel" or path[-2] not in ("query", "key", "value", "out"):
        return None
    if all((*path[:-2], n, "kernel") in paths for n in ("query", "key", "value", "out")):
        return 2 if path[-2] == "out" else 1
    return None


def _scanned(items: list[tuple[tuple[str, ...], Any]]) -> dict[tuple[str, ...], int]:
    """The blocks ``nn.scan`` stacked (``variable_axes={'params': 0}``), each mapped to its number of layers: the
    highest subtree of two or more arrays that all share one leading length and hold a ``bias`` or ``scale`` with
    an axis more than one layer's (a convolution's bias is 1-D, a scanned Dense's is layers × out)."""
    found: dict[tuple[str, ...], int] = {}
    for path, array in items:
        if path[-1] in ("bias", "scale") and isinstance(array, _Array) and len(array.shape) >= 2 and array.shape[0]:
            for k in range(2 if path[0] in _COLLECTIONS else 1, len(path) - 1):  # not a collection as a whole
                under = [a.shape[:1] if isinstance(a, _Array) else None for p, a in items if p[:k] == path[:k]]
                if len(under) > 1 and all(shape == array.shape[:1] for shape in under):
                    found.setdefault(path[:k], array.shape[0])
                    break
    return found


def _layers(array: _Array) -> list[_Array]:
    """The layers of an array stacked along its first axis (whose size was checked), as views of its bytes."""
    blob = memoryview(b"".join(array.pieces))  # one piece is joined as itself, not copied
    size = len(blob) // array.shape[0]
    return [_Array(array.shape[1:], array.dtype, (blob[i * size:(i + 1) * size],)) for i in range(array.shape[0])]


def _load(leaf: _Leaf) -> Any:
    array = leaf.array
    assert array is not None
    dtype = _dtype(array.dtype) or "float32"
    raw = np.frombuffer(bytearray(b"".join(array.pieces)), dtype=np.uint8)
    t: Any
    if dtype in NUMPY_DTYPES:
        # Viewed as stored (a big-endian ">f4" is float32 too: found by fuzzing), then in native order.
        t = raw.view(np.dtype(array.dtype)).reshape(array.shape).astype(NUMPY_DTYPES[dtype], copy=False)
    else:  # bfloat16: numpy has no such dtype, so torch holds it (or, without torch, a float32 copy).
        t = from_bytes(raw, dtype, array.shape)
    if is_torch(t):
        t = t.permute(*leaf.permute) if leaf.permute is not None else t
        return (t.reshape(leaf.matrix) if leaf.matrix else t).contiguous()
    # not ascontiguousarray, which makes a 0-D array 1-D
    t = np.transpose(t, leaf.permute) if leaf.permute is not None else t
    return np.require(t.reshape(leaf.matrix) if leaf.matrix else t, requirements="C")


def _dtype(name: str) -> Optional[str]:
    if name == "bfloat16":
        return "bfloat16"
    try:
        return numpy_dtype_name(np.dtype(name))
    except (TypeError, ValueError, SyntaxError):  # numpy parses "2l 3tf" or "," as a format string (found by fuzzing)
        return None


FLAX = register_format(FileFormat(name="flax", suffixes=(".msgpack",), open=FlaxSource,
                                  preferred="flax_model.msgpack", group="more", rank=40))
