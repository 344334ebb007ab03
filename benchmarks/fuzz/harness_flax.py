"""Fuzz the Flax msgpack reader: one ``flax_model.msgpack`` (msgpack maps, extension-type arrays,
chunked arrays)."""

from __future__ import annotations

from typing import Any

from benchmarks.fuzz.common import check_source, put

NAME = "flax"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a Flax checkpoint; raise on a finding."""
    check_source(put("flax_model.msgpack", data))


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
