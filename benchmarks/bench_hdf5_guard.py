"""What the HDF5 guard (``wbfe.sources.hdf5_guard``) costs a sound Keras read.

Reads Keras files (open, list, load every tensor) three ways, each the median of ``--n`` runs: with
the guard on a file it has not seen (one child walk), on a file it remembers (no child), and with
the guard off; the check alone on a file it has not seen (``check_only_s``); and the one-off start
of the walker, the helper interpreter that forks the checks (the first guarded open of a process).
The files: a ``.keras`` archive written by Keras 3 (a small CNN), and ``.weights.h5`` files of
``--layers`` Dense layers (Keras 3's layout, written with h5py) of two sizes.

    python benchmarks/bench_hdf5_guard.py [--n 7] [--layers 200]

Writes benchmarks/results/hdf5_guard.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "hdf5_guard.json"


def _read(path: Path) -> int:
    from wbfe.sources import open_source

    with open_source(path) as source:
        return sum(1 for e in source.entries() if e.skip is None and e.load() is not None)


def _dense_file(path: Path, layers: int, width: int) -> Path:
    import h5py
    import numpy as np

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        for i in range(layers):
            group = f.create_group(f"layers/dense{'_' + str(i) if i else ''}/vars")
            group.create_dataset("0", data=rng.standard_normal((width, width)).astype(np.float32))
            group.create_dataset("1", data=np.zeros(width, np.float32))
    return path


def _keras_file(path: Path) -> Path:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras

    keras.utils.set_random_seed(6)
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3), keras.layers.BatchNormalization(),
                              keras.layers.Flatten(), keras.layers.Dense(10, name="head")])
    model.save(path)
    return path


def _median(fn: Callable[[], Any], n: int, before: Callable[[], None] = lambda: None) -> float:
    times = []
    for _ in range(n):
        before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=7)
    parser.add_argument("--layers", type=int, default=200)
    args = parser.parse_args(argv)
    from wbfe.sources import hdf5_guard, keras_files

    guarded = keras_files.check_hdf5_index
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"cnn.keras": _keras_file(Path(tmp) / "cnn.keras"),
                 f"dense{args.layers}x64.weights.h5": _dense_file(Path(tmp) / "a.weights.h5", args.layers, 64),
                 f"dense{args.layers}x512.weights.h5": _dense_file(Path(tmp) / "b.weights.h5", args.layers, 512)}
        start = time.perf_counter()
        hdf5_guard.check_hdf5_index(files["cnn.keras"], member="model.weights.h5")  # starts the walker
        out["walker_start_s"] = round(time.perf_counter() - start, 4)
        for name, path in files.items():
            row: dict[str, Any] = {"bytes": path.stat().st_size, "tensors": _read(path)}
            row["guard_first_read_s"] = _median(lambda: _read(path), args.n, before=hdf5_guard._PASSED.clear)
            row["guard_remembered_s"] = _median(lambda: _read(path), args.n)
            # The check alone (a walk in a child, nothing read here): the guard's own cost, free of
            # the noise of loading the tensors.
            member = "model.weights.h5" if name.endswith(".keras") else None
            row["check_only_s"] = _median(lambda: hdf5_guard.check_hdf5_index(path, member=member), args.n,
                                          before=hdf5_guard._PASSED.clear)
            keras_files.check_hdf5_index = lambda *a, **k: None
            try:
                row["unguarded_s"] = _median(lambda: _read(path), args.n)
            finally:
                keras_files.check_hdf5_index = guarded
            row["first_read_overhead_s"] = round(row["guard_first_read_s"] - row["unguarded_s"], 4)
            for key in ("guard_first_read_s", "guard_remembered_s", "unguarded_s", "check_only_s"):
                row[key] = round(row[key], 4)
            out[name] = row
            print(name, row, flush=True)
    out["run"] = {"n": args.n, "python": platform.python_version(), "cpu_count": os.cpu_count(),
                  "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "note": "measured beside other work (the load average): the differences, not the absolute times"}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
