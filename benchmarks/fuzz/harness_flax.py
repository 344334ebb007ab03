"""Fuzz the Flax msgpack reader: one ``flax_model.msgpack`` (msgpack maps, extension-type arrays,
chunked arrays).

Independent check: the same bytes restored as ``flax.serialization.msgpack_restore`` restores them
(its extension types and its unchunking, rewritten here on :mod:`msgpack` and numpy, since flax is
not installed), then named and laid out by wbfe's documented rules (``wbfe.sources.flax_files``:
the collection dropped, ``kernel`` → ``weight`` transposed to out × in...): the reader lists
exactly those arrays, and each tensor read holds their bytes. A file msgpack refuses, or flax's
restore would, that the reader read is a finding.
"""

from __future__ import annotations

from typing import Any

from benchmarks.fuzz.common import RefusedTensor, check_source, put
from benchmarks.fuzz.harness_safetensors import read_as

NAME = "flax"
_RENAMED = {"kernel": "weight", "scale": "weight", "embedding": "weight", "mean": "running_mean",
            "var": "running_var"}


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a Flax checkpoint; raise on a finding."""
    path = put("flax_model.msgpack", data)
    check_source(path, reference=lambda: _flax_parse(data) if read_as(path, "flax") else None)


def _flax_parse(data: bytes) -> dict[str, Any]:
    import msgpack

    def ext_hook(code: int, payload: bytes) -> Any:  # flax's _msgpack_ext_unpack
        if code == 1:
            shape, dtype, buffer = msgpack.unpackb(payload, raw=True)
            return _Stored(tuple(shape), dtype, buffer)
        if code == 3:
            shape, dtype, buffer = msgpack.unpackb(payload, raw=True)
            return _Stored(None, dtype, buffer)
        return msgpack.ExtType(code, payload)

    try:
        tree = msgpack.unpackb(data, ext_hook=ext_hook, raw=False, strict_map_key=False)
        assert isinstance(tree, dict), "the top level is no map"
        tree = _unchunk_in_place(tree)
    except Exception as exc:  # noqa: BLE001 - any refusal of a file wbfe read
        raise AssertionError(f"flax's restore refuses a file the reader read: {type(exc).__name__}: {exc}") from None
    out: dict[str, Any] = {}
    stack: list[tuple[tuple[str, ...], Any]] = [((), tree)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [((*path, str(k)), v) for k, v in value.items()]
        elif isinstance(value, _Stored) and value.shape is None:  # a numpy scalar: wbfe lists it by its path
            out[".".join(path)] = RefusedTensor("a numpy scalar")
        elif isinstance(value, (_Stored, _Flat)):
            out[_torch_name(path)] = _layout(path, value)
    return out


class _Stored:
    """Extension type 1 or 3 as stored: (shape or None for a scalar, dtype name, bytes)."""

    def __init__(self, shape: Any, dtype: Any, buffer: Any):
        self.shape, self.dtype, self.buffer = shape, dtype, buffer


class _Flat:
    """A chunked array, unchunked as flax does: its chunks' arrays concatenated, then reshaped."""

    def __init__(self, shape: Any, chunks: list[Any]):
        self.shape, self.chunks = shape, chunks


def _unchunk_in_place(tree: dict[Any, Any]) -> Any:
    # flax's _unchunk_array_leaves_in_place: the marker key's presence (not its value) makes a chunked array.
    if "__msgpack_chunked_array__" in tree:
        return _Flat(_tuple_from_dict(tree["shape"]), list(_tuple_from_dict(tree["chunks"])))
    for key, value in tree.items():
        if isinstance(value, dict):
            tree[key] = _unchunk_in_place(value)
    return tree


def _tuple_from_dict(dct: Any) -> tuple[Any, ...]:
    return tuple(dct[str(i)] for i in range(len(dct)))


def _torch_name(path: tuple[str, ...]) -> str:
    keys = list(path[1:] if len(path) > 1 and path[0] in ("params", "batch_stats") else path)
    if keys and keys[-1] in _RENAMED:
        keys[-1] = _RENAMED[keys[-1]]
    return ".".join(keys)


def _layout(path: tuple[str, ...], value: Any) -> Any:
    """The array's bytes in PyTorch's layout, or its refusal (numpy cannot make it an array)."""
    import numpy as np

    try:
        if isinstance(value, _Flat):
            parts = [_restored(c) for c in value.chunks]
            array = np.concatenate(parts).reshape(value.shape)
        else:
            array = _restored(value)
    except Exception as exc:  # noqa: BLE001 - flax could not restore this array: the reader must not read it
        return RefusedTensor(f"{type(exc).__name__}: {exc}")
    if path and path[-1] == "kernel" and array.ndim >= 2:  # in × out (k… × in × out) to out × in (× k…)
        array = np.transpose(array, (array.ndim - 1, array.ndim - 2, *range(array.ndim - 2)))
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


def _restored(stored: Any) -> Any:
    """flax's _ndarray_from_bytes (bfloat16, which numpy lacks, as its 16-bit patterns)."""
    import numpy as np

    assert isinstance(stored, _Stored) and stored.shape is not None, "a chunk that is not an array"
    name = stored.dtype.decode()
    dtype = np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)
    return np.frombuffer(stored.buffer, dtype=dtype, count=-1, offset=0).reshape(stored.shape, order="C")


def _array(value: Any) -> Any:
    """An array as ``flax.serialization`` packs it: extension type 1 of ``(shape, dtype, bytes)``."""
    import msgpack

    return msgpack.ExtType(1, msgpack.packb((value.shape, value.dtype.name, value.tobytes()), use_bin_type=True))


def seeds() -> dict[str, bytes]:
    """Trees packed as ``flax.serialization.to_bytes`` packs them (flax itself is not needed)."""
    import msgpack
    import numpy as np

    rng = np.random.default_rng(8)

    def pack(tree: Any) -> bytes:
        return bytes(msgpack.packb(tree, use_bin_type=True))

    mlp = {"params": {"Dense_0": {"kernel": _array(rng.standard_normal((6, 10)).astype(np.float32)),
                                  "bias": _array(np.zeros(10, np.float32))},
                      "Dense_1": {"kernel": _array(rng.standard_normal((10, 3)).astype(np.float16))}}}
    cnn = {"params": {"Conv_0": {"kernel": _array(rng.standard_normal((3, 3, 2, 4)).astype(np.float32))},
                      "BatchNorm_0": {"scale": _array(np.ones(4, np.float32))},
                      "Embed_0": {"embedding": _array(rng.standard_normal((7, 4)).astype(np.float32))}},
           "batch_stats": {"BatchNorm_0": {"mean": _array(np.zeros(4, np.float32)),
                                           "var": _array(np.ones(4, np.float32))}},
           "step": msgpack.ExtType(3, msgpack.packb(((), "int32", np.int32(5).tobytes()), use_bin_type=True))}
    flat = rng.standard_normal(24).astype(np.float32)
    chunked = {"params": {"big": {"kernel": {"__msgpack_chunked_array__": True, "shape": {"0": 4, "1": 6},
                                             "chunks": {"0": _array(flat[:12]), "1": _array(flat[12:])}}}}}
    return {"mlp.msgpack": pack(mlp), "cnn.msgpack": pack(cnn), "chunked.msgpack": pack(chunked)}
