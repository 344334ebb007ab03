"""Fuzz the Keras reader: one ``model.h5`` (Keras 2 HDF5, Keras 3 ``.weights.h5``, or a ``.keras`` zip).

Independent check: where the reader reads the file, ``h5py`` opens the same bytes (the archive's
``model.weights.h5`` through :mod:`zipfile`): the reader lists exactly as many tensors as the file
holds datasets, of the same sizes, and each tensor read holds the values of one of them (compared
as the sorted bit patterns of its elements: the reader names a variable by Keras's rules and lays a
kernel out as PyTorch does, which moves elements but keeps them). A file ``h5py`` or ``zipfile``
refuses that the reader read is a finding.

The reader's HDF5 guard (:mod:`wbfe.sources.hdf5_guard`) walks each new file's index in a child
process, bounded in memory and time, before libhdf5 reads it here. For a user's file that costs
little; for fuzzing inputs, a child started per input, and a hanging input (about 2 % of them)
waited for 5 s twice (its walk refused, the harness's own read walked it again), made 2.3 inputs a
second. Here the guard's walk (its own ``_walk``, under its own memory bound) runs in one child
that walks input after input (:class:`_Walker`), each input is walked once, and a walk that
overruns the time bound, runs out of memory or kills the child ends in the refusal the guard gives
and a fresh child. The reader meets the same verdicts through the same exceptions; the guard is
left as users run it (``tests/test_fuzz_hdf5.py`` replays the hostile inputs through it).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import select
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from benchmarks.fuzz.common import check_source, put, time_bound
from benchmarks.fuzz.harness_safetensors import read_as

NAME = "keras"


# Seconds a walk may take. The guard's bound is 20 s; a sound index of this harness's files (23 kB
# at most) is walked in milliseconds, while libFuzzer's mutations of an attribute meet libhdf5's
# endless read of it (tests/fuzz_corpus/keras/hdf5-attribute-hang-*) in about 2 % of inputs: at
# 5 s each they took most of the run's time.
WALK_TIMEOUT_S = 1.0
# Walks per child before a fresh one: libhdf5's caches and a heap that only grows stay small.
_WALKS_PER_CHILD = 2000
# Seconds a child may take to start (an interpreter importing h5py and wbfe, on a busy machine).
_START_S = 120.0


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a Keras file; raise on a finding."""
    from wbfe.sources import keras_files

    import wbfe.sources

    path = put("model.h5", data)
    read = _Read()
    guard, keras_files.check_hdf5_index = keras_files.check_hdf5_index, _WALKER.check
    opener, wbfe.sources.open_source = wbfe.sources.open_source, read.opener(wbfe.sources.open_source)
    try:
        check_source(path, compare=read.compare)
        wbfe.sources.open_source = opener
        if read.complete and read_as(path, "keras"):  # (another format's magic goes to that reader: see
            with time_bound():                          # harness_safetensors.read_as)
                _same_datasets(path, data, read.entries, read.bits)
    finally:
        keras_files.check_hdf5_index = guard
        wbfe.sources.open_source = opener


class _Read:
    """What check_source's own read of the file gave (its first open's entries, and the sorted bits
    of each tensor it loaded), so that the h5py comparison needs no second read by the reader."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.bits: Counter[tuple[int, str]] = Counter()
        self.complete = False  # every entry listed and loaded, nothing refused
        self._opened = False

    def opener(self, open_source: Any) -> Any:
        def opened(*args: Any, **kwargs: Any) -> Any:
            source = open_source(*args, **kwargs)
            if not self._opened:  # check_source's open (the engine's, later, is not watched)
                self._opened = True
                listing = source.entries

                def entries() -> Any:
                    for entry in listing():
                        self.entries.append(entry)
                        yield entry
                    self.complete = True

                source.entries = entries
            return source

        return opened

    def compare(self, entry: Any, tensor: Any) -> None:
        self.bits[_sorted_bits(tensor)] += 1


class _Walker:
    """:func:`wbfe.sources.hdf5_guard.check_hdf5_index` with one child for many files: the child
    (``python -m benchmarks.fuzz.harness_keras --walk``) limits its address space once, as the
    guard's child does, to what it holds plus ``WALK_MEMORY_BYTES``, then walks each file it is
    sent with the guard's ``_walk`` and answers with the guard's verdict. A child stopped (a walk
    past the time bound, out of memory, or dead) is replaced at once, so the next walk finds its
    successor started."""

    def __init__(self) -> None:
        self._child: Optional[subprocess.Popen[bytes]] = None
        self._ready = False
        self._walks = 0
        # The verdicts on the current input (by its bytes): its three reads walk it once.
        self._verdicts: dict[tuple[object, ...], Any] = {}
        atexit.register(self.stop)

    def stop(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        self._child = subprocess.Popen([sys.executable, "-m", "benchmarks.fuzz.harness_keras", "--walk"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       cwd=root, env={**os.environ, "PYTHONPATH": root})
        self._ready, self._walks = False, 0

    def _replace(self) -> None:
        self.stop()
        self._start()

    def _ask(self, path: Path, member: Optional[str], window: Optional[tuple[int, int]]) -> Any:
        """The child's verdict: None (a clean walk), [kind, text], "timeout" or "died"."""
        if self._child is None or self._walks >= _WALKS_PER_CHILD:
            self._replace()
        if not self._ready:  # its start is not the walk's time
            if self._answer(_START_S) != "ready":
                self.stop()
                raise RuntimeError("the harness's HDF5 walking child did not start")
            self._ready = True
        assert self._child is not None and self._child.stdin is not None
        self._walks += 1
        try:
            self._child.stdin.write(json.dumps([str(path), member, window]).encode() + b"\n")
            self._child.stdin.flush()
        except OSError:
            self._replace()
            return "died"
        verdict = self._answer(WALK_TIMEOUT_S)
        if verdict in ("timeout", "died") or (
                isinstance(verdict, list) and (verdict[0] == "MemoryError" or "memory allocation failed" in verdict[1])):
            self._replace()  # a heap run out may be left in any state (an error libhdf5 raised is not)
        return verdict

    def _answer(self, seconds: float) -> Any:
        """The child's next line, decoded; "timeout" or "died"."""
        assert self._child is not None and self._child.stdout is not None
        fd, line = self._child.stdout.fileno(), b""
        while not line.endswith(b"\n"):
            if not select.select([fd], [], [], seconds)[0]:
                return "timeout"
            chunk = os.read(fd, 65536)
            if not chunk:
                return "died"
            line += chunk
        return json.loads(line)

    def check(self, path: Path, *, window: Optional[tuple[int, int]] = None, member: Optional[str] = None) -> None:
        """As :func:`~wbfe.sources.hdf5_guard.check_hdf5_index`: return if the walk was clean,
        else raise what the guard raises for the same outcome."""
        from wbfe.errors import CorruptCheckpointError
        from wbfe.sources.hdf5_guard import WALK_MEMORY_BYTES, Hdf5IndexError

        try:
            data = path.read_bytes()
        except OSError:
            return  # the reader's own open reports it
        # By content, not by the file's times as the guard does: the scratch file is rewritten faster
        # than the clock that stamps it moves.
        key = (hashlib.sha1(data).digest(), window, member)
        if key in self._verdicts:
            verdict = self._verdicts[key]
        else:
            if not any(k[0] == key[0] for k in self._verdicts):
                self._verdicts.clear()
            verdict = self._verdicts[key] = self._ask(path, member, window)
        if verdict is None:
            return
        what = f"{path}{f' ({member})' if member else ''}"
        if verdict == "timeout":
            raise CorruptCheckpointError(
                f"{what}: the HDF5 library did not finish reading the file's index within {WALK_TIMEOUT_S:g} s: "
                "the file is damaged or hostile", path=str(path))
        kind, text = ("", "") if verdict == "died" else verdict
        if kind == "MemoryError" or "memory allocation failed" in text:
            raise CorruptCheckpointError(
                f"{what}: the HDF5 library ran out of memory ({WALK_MEMORY_BYTES >> 20} MiB) reading the file's "
                "index: the file is damaged or hostile", path=str(path))
        if not kind:
            raise CorruptCheckpointError(
                f"{what}: the HDF5 library crashed reading the file's index: the file is damaged or hostile",
                path=str(path))
        raise Hdf5IndexError(f"{what}: {text or kind}", path=str(path), kind=kind, text=text or kind)


_WALKER = _Walker()


def _serve() -> None:
    """The walking child: one JSON request a line on stdin, one verdict a line on stdout."""
    import resource

    from wbfe.sources import hdf5_guard
    from wbfe.sources.file_window import FileWindow

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything libhdf5 prints goes to stderr, never into the answers
    used = hdf5_guard._address_space()
    resource.setrlimit(resource.RLIMIT_AS, (used + hdf5_guard.WALK_MEMORY_BYTES, used + hdf5_guard.WALK_MEMORY_BYTES))
    answers.write(json.dumps("ready") + "\n")
    answers.flush()
    for line in sys.stdin:
        path, member, window = json.loads(line)
        verdict: Any = None
        try:
            if member:
                with zipfile.ZipFile(path) as archive, archive.open(member) as fh:
                    hdf5_guard._walk(fh)
            else:
                hdf5_guard._walk(FileWindow(path, *window) if window else path)
        except MemoryError:
            verdict = ["MemoryError", ""]
        except BaseException as exc:  # noqa: BLE001 - every failure of the walk is the verdict
            verdict = [type(exc).__name__, str(exc)[:300]]
        answers.write(json.dumps(verdict) + "\n")
        answers.flush()


def _sorted_bits(array: Any) -> tuple[int, str]:
    """(element count, digest of the element bit patterns in sorted order): a layout's invariant."""
    import numpy as np

    from wbfe.linalg.arrays import flat_bytes

    raw = np.ascontiguousarray(flat_bytes(array))
    size = array.element_size() if hasattr(array, "element_size") else array.dtype.itemsize
    bits = raw.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size]) if size in (1, 2, 4, 8) else raw
    return int(bits.size), hashlib.sha1(np.sort(bits).tobytes()).hexdigest()


def _same_datasets(path: Path, data: bytes, entries: list[Any], read: Counter[tuple[int, str]]) -> None:
    import h5py
    import numpy as np

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


if __name__ == "__main__" and sys.argv[1:] == ["--walk"]:
    _serve()
