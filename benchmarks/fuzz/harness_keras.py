"""Fuzz the Keras reader: one ``model.h5`` (Keras 2 HDF5, Keras 3 ``.weights.h5``, or a ``.keras`` zip).

Independent check: where the reader reads the file, ``h5py`` opens the same bytes (the archive's
``model.weights.h5`` through :mod:`zipfile`): the reader lists exactly as many tensors as the file
holds datasets, of the same sizes, and each tensor read holds the values of one of them (compared
as the sorted bit patterns of its elements: the reader names a variable by Keras's rules and lays a
kernel out as PyTorch does, which moves elements but keeps them). A file ``h5py`` or ``zipfile``
refuses that the reader read is a finding.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.fuzz.common import check_source, put, time_bound
from benchmarks.fuzz.harness_safetensors import read_as
from wbfe.errors import WbfeError

NAME = "keras"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a Keras file; raise on a finding."""
    from wbfe.sources import hdf5_guard

    path = put("model.h5", data)
    # A hostile file is refused when the guard's child times out: 5 s here, not 20, so that such
    # inputs (two are in the corpus) do not take the fuzzing's time.
    bound, hdf5_guard.WALK_TIMEOUT_S = hdf5_guard.WALK_TIMEOUT_S, min(hdf5_guard.WALK_TIMEOUT_S, 5.0)
    try:
        check_source(path)
        if read_as(path, "keras"):  # (another format's magic goes to that reader: see harness_safetensors.read_as)
            with time_bound():
                _same_datasets(path, data)
    finally:
        hdf5_guard.WALK_TIMEOUT_S = bound


def _sorted_bits(array: Any) -> tuple[int, str]:
    """(element count, digest of the element bit patterns in sorted order): a layout's invariant."""
    import numpy as np

    from wbfe.linalg.arrays import flat_bytes

    raw = np.ascontiguousarray(flat_bytes(array))
    size = array.element_size() if hasattr(array, "element_size") else array.dtype.itemsize
    bits = raw.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size]) if size in (1, 2, 4, 8) else raw
    return int(bits.size), hashlib.sha1(np.sort(bits).tobytes()).hexdigest()


def _same_datasets(path: Path, data: bytes) -> None:
    import h5py
    import numpy as np

    from wbfe.linalg.arrays import is_known_dtype
    from wbfe.sources import open_source

    try:
        with open_source(path) as source:
            entries = list(source.entries())
            read = Counter(_sorted_bits(e.load()) for e in entries if e.skip is None and is_known_dtype(str(e.dtype)))
    except WbfeError:
        return  # refused (check_source saw the same)
    sizes = Counter(int(np.prod(e.shape, dtype=np.int64)) for e in entries)
    try:
        if data[:4] == b"PK\x03\x04":
            with zipfile.ZipFile(path) as archive, archive.open("model.weights.h5") as fh:
                stored = _datasets(h5py, fh, read)
        else:
            stored = _datasets(h5py, path, read)
    except Exception as exc:  # noqa: BLE001 - any refusal by h5py of a file the reader read
        raise AssertionError(f"h5py refuses a file the reader read: {type(exc).__name__}: {exc}") from None
    assert sizes == Counter(size for size, _ in stored), "the reader's tensors are not the file's datasets"
    missing = read - Counter(bits for _, bits in stored if bits is not None)
    assert not missing, "a tensor read holds values no dataset of the file holds"


def _datasets(h5py: Any, target: Any, read: Counter) -> list[tuple[int, Any]]:
    """Every dataset's (size, sorted bits): its values read only where a tensor read has its size
    (a dataset the reader skips is not read here either)."""
    wanted = {size for size, _ in read}
    out: list[tuple[int, Any]] = []
    with h5py.File(target, "r") as f:
        found: list[Any] = []
        f.visititems(lambda name, obj: found.append(obj) if isinstance(obj, h5py.Dataset) else None)
        for ds in found:
            size = int(ds.size)
            out.append((size, _sorted_bits(ds[()]) if size in wanted and ds.dtype.kind in "fiub" else None))
    return out


def seeds() -> dict[str, bytes]:
    """Files written by Keras 3 itself (on its torch backend): a ``.keras`` archive, its
    ``.weights.h5`` and a legacy HDF5 ``model.save``; and a Keras 2 layout written with h5py."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import h5py
    import keras
    import numpy as np

    keras.utils.set_random_seed(6)
    model = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(3, 3), keras.layers.BatchNormalization(),
                              keras.layers.Flatten(), keras.layers.Dense(5, name="head")])
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("model.keras", "model.weights.h5", "legacy.h5"):
            path = Path(tmp) / name
            if name == "model.weights.h5":
                model.save_weights(path)
            else:
                model.save(path)
            out[name] = path.read_bytes()
        path = Path(tmp) / "keras2.h5"
        rng = np.random.default_rng(6)
        with h5py.File(path, "w") as f:  # Keras 2's save_weights layout: layers at the root
            f.attrs["layer_names"] = np.array([b"dense", b"dense_1"])
            f.attrs["keras_version"] = b"2.15.0"
            f.attrs["backend"] = b"tensorflow"
            for layer, (n_in, n_out) in (("dense", (4, 8)), ("dense_1", (8, 3))):
                group = f.create_group(layer)
                group.attrs["weight_names"] = np.array([f"{layer}/kernel:0".encode(), f"{layer}/bias:0".encode()])
                group.create_dataset(f"{layer}/kernel:0", data=rng.standard_normal((n_in, n_out)).astype(np.float32))
                group.create_dataset(f"{layer}/bias:0", data=np.zeros(n_out, np.float32))
        out["keras2.h5"] = path.read_bytes()
    return out
