"""Fuzz the Keras reader: one ``model.h5`` (Keras 2 HDF5, Keras 3 ``.weights.h5``, or a ``.keras`` zip)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from benchmarks.fuzz.common import check_source, put

NAME = "keras"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a Keras file; raise on a finding."""
    check_source(put("model.h5", data))


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
