"""Walk an HDF5 file's index in a child process, bounded in time and memory, before libhdf5 reads
it in this one.

libhdf5 trusts a file's structures: a damaged one can make it loop forever (reading a
variable-length string attribute) or allocate gigabytes (listing a group whose link names are
damaged), inside one C call that holds the GIL, where no Python timeout, signal handler or
``MemoryError`` can reach it (found by fuzzing: ``tests/fuzz_corpus/keras/hdf5-*``). So the first
time a file is opened, a child process walks what the Keras reader will touch, and more: every
group's link names, every object's attributes, every dataset's shape, type and extent. The child
runs under an address-space limit (:data:`WALK_MEMORY_BYTES` above what it holds when forked) and
a wall-clock timeout (:data:`WALK_TIMEOUT_S`); a child that runs out of either, crashes, or meets
an error in the file's index ends in a typed :class:`~wbfe.errors.CorruptCheckpointError`, and
this process never gives the file to libhdf5. The dataset values are not read by the child: they
are read when a tensor is asked for, through the index checked here.

Children are forked by multiprocessing's fork server, started once per process with h5py already
imported (a fork of this process could inherit a lock another thread holds; a fresh interpreter per
file would cost half a second), so a check costs one fork and the walk. A file that passed is
remembered while it is unchanged (device, inode, size, mtime, ctime): reading it again costs
nothing. Where there is no fork server (Windows) the files are read unguarded.
"""

from __future__ import annotations

import multiprocessing
import zipfile
from pathlib import Path
from typing import Any, Optional

from wbfe.errors import CorruptCheckpointError
from wbfe.sources.file_window import FileWindow

__all__ = ["WALK_TIMEOUT_S", "WALK_MEMORY_BYTES", "Hdf5IndexError", "check_hdf5_index"]

# A sound index of even a large model is walked in well under a second; these bounds only stop a
# walk that would never end, or would take the machine's memory.
WALK_TIMEOUT_S = 20.0
WALK_MEMORY_BYTES = 1 << 30

_PASSED: dict[tuple[object, ...], bool] = {}
_MAX_REMEMBERED = 4096

_CONTEXT: Any = None


def _context() -> Any:
    """multiprocessing's fork-server context, with h5py preloaded; None where there is none."""
    global _CONTEXT
    if _CONTEXT is None:
        if "forkserver" not in multiprocessing.get_all_start_methods():
            return None
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["h5py", __name__])
    return _CONTEXT


def _walk(target: Any) -> None:
    import h5py

    with h5py.File(target, "r") as f:
        objects: list[Any] = [f]
        f.visititems(lambda name, obj: objects.append(obj))
        for obj in objects:
            if isinstance(obj, h5py.Group):
                list(obj.keys())
            else:
                _ = (obj.shape, obj.dtype, obj.id.get_offset(), obj.id.get_storage_size())
            for key in list(obj.attrs):
                try:
                    obj.attrs.get(key)
                except (TypeError, ValueError):  # a type h5py does not convert: no damage of the file
                    pass


def _child(conn: Any, path: str, member: Optional[str], window: Optional[tuple[int, int]], memory: int) -> None:
    """The forked child: limit its memory, walk, send ``(error type, text)`` or None."""
    try:
        import resource

        used = _address_space()
        resource.setrlimit(resource.RLIMIT_AS, (used + memory, used + memory))
        if member:
            with zipfile.ZipFile(path) as archive, archive.open(member) as fh:
                _walk(fh)
        else:
            _walk(FileWindow(path, *window) if window else path)
        conn.send(None)
    except MemoryError:
        conn.send(("MemoryError", ""))
    except BaseException as exc:  # noqa: BLE001 - every failure of the walk is the verdict
        conn.send((type(exc).__name__, str(exc)[:300]))


def _address_space() -> int:
    """This process's virtual memory size in bytes (Linux's /proc; 0 where unknown)."""
    try:
        with open("/proc/self/statm") as fh:
            import os

            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Hdf5IndexError(CorruptCheckpointError):
    """The child's walk of the file's index met an error of libhdf5 (``kind``: its exception type)."""

    def __init__(self, message: str, *, path: str, kind: str, text: str):
        super().__init__(message, path=path)
        self.kind, self.text = kind, text


def check_hdf5_index(path: Path, *, window: Optional[tuple[int, int]] = None, member: Optional[str] = None) -> None:
    """Walk the HDF5 index of ``path`` (or of the bytes ``window = (offset, size)`` of it, or of its
    zip ``member``) in a bounded child process; return when it finished cleanly.

    Raises:
        CorruptCheckpointError: the walk did not finish within :data:`WALK_TIMEOUT_S`, ran out of
            :data:`WALK_MEMORY_BYTES`, or crashed: the file is damaged or hostile.
        Hdf5IndexError: libhdf5 refused the index (a damaged or truncated file).
    """
    try:
        st = path.stat()
    except OSError:
        return  # the reader's own open reports it
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, window, member)
    if key in _PASSED:
        return
    context = _context()
    if context is None:
        return
    what = f"{path}{f' ({member})' if member else ''}"
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, str(path), member, window, WALK_MEMORY_BYTES), daemon=True)
    child.start()
    send.close()
    try:
        finished = receive.poll(WALK_TIMEOUT_S)
        verdict = receive.recv() if finished else None
    except (EOFError, OSError):  # the child died before it could answer
        finished, verdict = True, ("", "")
    finally:
        receive.close()
        if child.is_alive() and not finished:
            child.kill()
        child.join(5)
    if not finished:
        raise CorruptCheckpointError(
            f"{what}: the HDF5 library did not finish reading the file's index within {WALK_TIMEOUT_S:g} s: "
            "the file is damaged or hostile", path=str(path))
    if verdict is None:
        if len(_PASSED) >= _MAX_REMEMBERED:
            _PASSED.clear()
        _PASSED[key] = True
        return
    kind, text = verdict
    if kind == "MemoryError" or "memory allocation failed" in text:
        raise CorruptCheckpointError(
            f"{what}: the HDF5 library ran out of memory ({WALK_MEMORY_BYTES >> 20} MiB) reading the file's "
            "index: the file is damaged or hostile", path=str(path))
    if not kind:
        raise CorruptCheckpointError(
            f"{what}: the HDF5 library crashed reading the file's index (exit code {child.exitcode}): the file "
            "is damaged or hostile", path=str(path))
    raise Hdf5IndexError(f"{what}: {text or kind}", path=str(path), kind=kind, text=text or kind)
