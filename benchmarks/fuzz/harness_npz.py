"""Fuzz the NumPy ``.npz`` reader: one ``weights.npz``.

Independent check: the reader lists exactly the archive's ``.npy`` members as ``numpy.load`` names
them, and each tensor read holds the bytes ``numpy.load(allow_pickle=False)`` reads for it; an
archive numpy refuses that the reader read is a finding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from benchmarks.fuzz.common import RefusedTensor, check_source, put
from benchmarks.fuzz.harness_safetensors import read_as  # another format's magic goes to that reader

NAME = "npz"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as an ``.npz`` archive; raise on a finding."""
    path = put("weights.npz", data)
    check_source(path, reference=lambda: _numpy_parse(path) if read_as(path, "npz") else None)


def _numpy_parse(path: Path) -> Optional[dict[str, Any]]:
    import numpy as np

    out: dict[str, Any] = {}
    try:
        with np.load(path, allow_pickle=False) as archive:
            # numpy names a member by its file name less ".npy"; wbfe reads the .npy members only
            # (a member of another name is no array).
            members = [m[: -len(".npy")] for m in archive.zip.namelist() if m.endswith(".npy")]
            for name in members:
                try:
                    array = archive[name]
                except Exception as exc:  # noqa: BLE001 - numpy cannot read this array: the reader must not either
                    out[name] = RefusedTensor(f"{type(exc).__name__}: {exc}")
                    continue
                out[name] = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
    except Exception as exc:  # noqa: BLE001 - any refusal by numpy of an archive wbfe read
        raise AssertionError(f"numpy.load refuses an archive the reader read: {type(exc).__name__}: {exc}") from None
    return out


def seeds() -> dict[str, bytes]:
    """Archives written by ``numpy.savez`` and ``numpy.savez_compressed``."""
    import io

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
