"""The HDF5 guard (issue #33 §3, ``wbfe.sources.hdf5_guard``): the inputs the Keras harness found to
hang libhdf5 or make it allocate gigabytes end in a typed error within a bounded time, and a sound
Keras file passes the guard once, then is read without it while unchanged.

Each hostile input is opened in a child interpreter under a wall-clock limit, so that a broken
guard fails this test rather than hanging the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fuzz_corpus" / "keras"
HOSTILE = {"hdf5-attribute-hang-4fb9612c.bin": "did not finish reading the file's index within 3 s",
           "hdf5-link-name-oom-54ffd55a.bin": ""}
_OPEN = """
import json, sys, time
from wbfe.errors import WbfeError
from wbfe.sources import hdf5_guard, open_source
hdf5_guard.WALK_TIMEOUT_S = 3.0
start = time.monotonic()
try:
    with open_source(sys.argv[1]) as source:
        names = [e.name for e in source.entries()]
    print(json.dumps({"read": names}))
except WbfeError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}))
"""


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_hdf5_ends_in_a_typed_error_in_bounded_time(tmp_path: Path, name: str) -> None:
    path = tmp_path / ("model.keras" if "keras" in name or name.endswith("54ffd55a.bin") else "model.h5")
    path.write_bytes((CORPUS / name).read_bytes())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    start = time.monotonic()
    # 100 s: the guard's 3 s and the walker's start, with room for a loaded machine; without the
    # guard the open never returns (or is killed for memory), and this fails.
    done = subprocess.run([sys.executable, "-c", _OPEN, str(path)], capture_output=True, text=True, timeout=100,
                          env=env)
    elapsed = time.monotonic() - start
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result.get("error") == "CorruptCheckpointError", (result, done.stderr[-2000:])
    assert result["message"].startswith(str(path)) and HOSTILE[name] in result["message"], result
    assert result["seconds"] < 60 and elapsed < 100


def test_a_sound_file_passes_once_and_is_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from wbfe.sources import hdf5_guard

    path = tmp_path / "w.h5"
    with h5py.File(path, "w") as f:
        f.attrs["backend"] = "tensorflow"
        f.create_dataset("layers/dense/vars/0", data=np.arange(12, dtype=np.float32).reshape(3, 4))
    hdf5_guard.check_hdf5_index(path)
    monkeypatch.setattr(hdf5_guard, "_walker", lambda: pytest.fail("a remembered file was walked again"))
    hdf5_guard.check_hdf5_index(path)
    os.utime(path, ns=(1, 1))  # changed (its mtime, and so its ctime): walked again
    monkeypatch.undo()
    calls: list[int] = []
    real = hdf5_guard._walker

    def counted() -> object:
        calls.append(1)
        return real()

    monkeypatch.setattr(hdf5_guard, "_walker", counted)
    hdf5_guard.check_hdf5_index(path)
    assert calls == [1]


def test_a_damaged_index_is_refused_with_the_libraries_words(tmp_path: Path) -> None:
    from wbfe.errors import CorruptCheckpointError
    from wbfe.sources import open_source

    path = tmp_path / "model.weights.h5"
    h5py = pytest.importorskip("h5py")
    import numpy as np

    with h5py.File(path, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.ones((4, 4), np.float32))
    raw = bytearray(path.read_bytes())
    path.write_bytes(bytes(raw[: len(raw) // 2]))  # the index cut short
    with pytest.raises(CorruptCheckpointError, match=str(path)):
        with open_source(path) as source:
            list(source.entries())
