"""What every harness shares: a reused scratch folder, a per-input time bound, and the invariants
checked on whatever a reader returns."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np

from wbfe.errors import WbfeError

__all__ = ["Hang", "REFUSALS", "refused", "scratch", "put", "fresh_folder", "time_bound", "check_source",
           "check_engine", "Compare", "Reference", "RefusedTensor", "TIME_BOUND", "USE_ALARM"]

# Seconds one input may take (a hang is a finding). Under libFuzzer, whose -timeout uses SIGALRM
# itself (and also stops a hang in native code), benchmarks/fuzz/run.py sets USE_ALARM off.
TIME_BOUND = 20.0
USE_ALARM = True
# The engine is run on a source whose tensors are this small (and this few): it is the slow part.
_ENGINE_BYTES = 1 << 20
_ENGINE_ENTRIES = 64

_SCRATCH: Optional[Path] = None
# The latest refusals (WbfeError messages) of the harnesses: the replay test checks that no seed,
# a valid file, is refused.
REFUSALS: list[str] = []


def refused(exc: WbfeError) -> None:
    """Note a refusal (the right answer to a bad input; a seed must not get one)."""
    REFUSALS.append(f"{type(exc).__name__}: {exc}")
    del REFUSALS[:-20]


class Hang(AssertionError):
    """An input that took longer than :data:`TIME_BOUND` seconds."""


def scratch() -> Path:
    """This process's scratch folder (in memory where ``/dev/shm`` exists), made once and reused."""
    global _SCRATCH
    if _SCRATCH is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        _SCRATCH = Path(tempfile.mkdtemp(prefix="wbfe-fuzz-", dir=base))
    return _SCRATCH


def fresh_folder(name: str) -> Path:
    """An empty folder ``name`` in the scratch folder (emptied if it was used before)."""
    folder = scratch() / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    return folder


def put(name: str, data: bytes, folder: Optional[Path] = None) -> Path:
    """Write ``data`` to ``name`` in ``folder`` (default: the scratch folder) and return its path."""
    path = (folder or scratch()) / name
    path.write_bytes(data)
    return path


@contextlib.contextmanager
def time_bound(seconds: float = TIME_BOUND) -> Iterator[None]:
    """Raise :class:`Hang` in this (main) thread when the block runs longer than ``seconds``."""

    if not USE_ALARM:
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"the input took more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# compare(entry, tensor): an independent check that the tensor holds the bytes the file stores for
# it (a harness's own parse, or the format's reference package); raises AssertionError if not.
Compare = Callable[[Any, Any], None]
# reference(): the file's tensors as the format's reference package parses the same bytes, {name:
# the bytes of its stored values (or a tuple of the layouts the reader may give: a matrix or its
# transpose), None where the reader reads a transform of them (ONNX's dequantised weights), or a
# RefusedTensor where the reference cannot read that tensor}, or None where the reference cannot
# list them (a layout wbfe unwraps by its own rules). Raises AssertionError where the reference refuses a file wbfe read.
class RefusedTensor(str):
    """The reference's refusal of one tensor: the reader must skip it, never read numbers from it."""


Reference = Callable[[], Optional[dict[str, Union[None, bytes, tuple[bytes, ...], RefusedTensor]]]]


def check_source(ref: Any, *, compare: Optional[Compare] = None, reference: Optional[Reference] = None,
                 engine: bool = True) -> None:
    """Open ``ref`` with :func:`wbfe.sources.open_source`, read every entry, check the invariants,
    then score it with the engine when it is small. With ``reference``, the reader's list (read or
    skipped) must be exactly the reference's tensors, and every tensor read must hold the bytes the
    reference reads for it. A :class:`WbfeError` anywhere ends it quietly
    (a refusal is the right answer to a bad file); anything else propagates (a finding).

    Raises:
        AssertionError: a broken invariant.
    """
    from wbfe.linalg.arrays import dtype_name, flat_bytes, is_known_dtype, is_torch
    from wbfe.sources import open_source

    names: list[str] = []
    held: dict[str, bytes] = {}
    total = 0
    try:
        with time_bound(), open_source(ref) as source:
            for entry in source.entries():
                assert isinstance(entry.name, str), f"entry name {entry.name!r} is not text"
                assert isinstance(entry.shape, tuple) and all(type(s) is int and s >= 0 for s in entry.shape), (
                    f"{entry.name!r}: shape {entry.shape!r} is not a tuple of non-negative ints")
                names.append(entry.name)
                if entry.skip is not None:
                    assert isinstance(entry.skip, str) and entry.skip.strip(), f"{entry.name!r}: empty skip reason"
                    continue
                if not is_known_dtype(str(entry.dtype)):
                    # A storage type wbfe holds no tensors of (a GGUF quant the gguf package cannot
                    # dequantise): the engine's planner skips it, never loads it; check_engine
                    # checks that it is listed as skipped with its reason.
                    continue
                tensor = entry.load()
                assert isinstance(tensor, np.ndarray) or is_torch(tensor), (
                    f"{entry.name!r}: load() gave a {type(tensor).__name__}")
                assert tuple(tensor.shape) == entry.shape, (
                    f"{entry.name!r}: load() gave shape {tuple(tensor.shape)}, the entry says {entry.shape}")
                assert dtype_name(tensor) == entry.dtype, (
                    f"{entry.name!r}: load() gave {dtype_name(tensor)}, the entry says {entry.dtype}")
                total += int(flat_bytes(tensor).size)
                if reference is not None:
                    held[entry.name] = flat_bytes(tensor).tobytes()
                if compare is not None:
                    compare(entry, tensor)
                del tensor
    except WbfeError as exc:
        refused(exc)
        return
    if reference is not None:
        check_reference(names, held, reference)
    if engine and names and len(names) <= _ENGINE_ENTRIES and total <= _ENGINE_BYTES:
        check_engine(ref, names)


def check_reference(names: list[str], held: dict[str, bytes], reference: Reference) -> None:
    """The reader's list against the reference parse: the same tensors, each read one the same bytes.

    Raises:
        AssertionError: a tensor one lists and the other does not, or different bytes.
    """
    with time_bound():
        stored = reference()
    if stored is None:
        return
    assert len(set(names)) == len(names), (  # two tensors of one name: which is the row of that name?
        f"the reader lists {sorted({n for n in names if names.count(n) > 1})} twice")
    assert sorted(names) == sorted(stored), (
        f"the reader lists {sorted(set(names) - set(stored))} the reference does not, and misses "
        f"{sorted(set(stored) - set(names))}")
    for name, data in held.items():
        want = stored[name]
        assert not isinstance(want, RefusedTensor), f"{name!r}: read, but the reference refuses it: {want}"
        assert want is None or data in (want if isinstance(want, tuple) else (want,)), (
            f"{name!r}: not the bytes the reference package reads for it")


def check_engine(ref: Any, names: list[str]) -> None:
    """Score ``ref`` (cheap metrics, CPU) and check that every entry is a row or a skip with a
    reason: the engine must account for every tensor the reader listed.

    Raises:
        AssertionError: an entry the result does not account for, or a skip without a reason.
    """
    import wbfe

    try:
        with time_bound():
            result = wbfe.score(ref, metrics="bfe", device="cpu")
    except WbfeError as exc:
        refused(exc)
        return
    seen = [str(row.get("name")) for row in result.layers]
    for skip in result.skipped:
        assert isinstance(skip.get("reason"), str) and skip["reason"].strip(), f"skip without a reason: {skip!r}"
        seen.append(str(skip.get("name")))
    seen_set = set(seen)
    for name in names:  # an expert stack or sliced conv is accounted for by rows named after it
        assert name in seen_set or any(s.startswith(name) for s in seen), (
            f"tensor {name!r} is neither a row nor a skip of the engine's result")
