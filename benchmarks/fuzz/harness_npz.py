"""Fuzz the NumPy ``.npz`` reader: one ``weights.npz``.

Independent check: a tensor named as an array of the archive holds the bytes ``numpy.load`` reads.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from benchmarks.fuzz.common import check_source, put

NAME = "npz"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as an ``.npz`` archive; raise on a finding."""
    path = put("weights.npz", data)
    check_source(path, compare=lambda entry, tensor: _same_bytes(path, entry, tensor))


def _same_bytes(path: Path, entry: Any, tensor: Any) -> None:
    import numpy as np

    from wbfe.arrays import flat_bytes

    try:
        with np.load(path, allow_pickle=False) as archive:
            if entry.name not in archive.files:
                return
            stored = archive[entry.name]
    except Exception:  # noqa: BLE001 - numpy refuses what wbfe read: no reference to compare with
        return
    held = flat_bytes(tensor)
    if stored.shape == tuple(tensor.shape) and stored.dtype.itemsize * stored.size == held.size:
        got = held.tobytes()
        assert got == np.ascontiguousarray(stored).astype(stored.dtype.newbyteorder("<")).tobytes(), (
            f"{entry.name!r}: not the bytes numpy reads for it")


def seeds() -> dict[str, bytes]:
    """Archives written by ``numpy.savez`` and ``numpy.savez_compressed``."""
    import numpy as np

    rng = np.random.default_rng(5)
    arrays: dict[str, Any] = {
        "fc1.weight": rng.standard_normal((12, 6)).astype(np.float32), "fc1.bias": np.zeros(12, np.float32),
        "fc2.weight": rng.standard_normal((3, 12)).astype(np.float16), "steps": np.array(4, np.int64),
    }
    out = {}
    for name, save in (("plain.npz", np.savez), ("compressed.npz", np.savez_compressed)):
        buffer = io.BytesIO()
        save(buffer, **arrays)
        out[name] = buffer.getvalue()
    buffer = io.BytesIO()
    np.savez(buffer, rng.standard_normal((5, 4)).astype(np.float64), big=rng.standard_normal((4, 4)).astype(">f4"))
    out["positional.npz"] = buffer.getvalue()
    return out
