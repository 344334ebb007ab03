"""Walk an HDF5 file's index in a forked child, bounded in time and memory, before libhdf5 reads it in this
process: a damaged file can make libhdf5 loop forever or allocate gigabytes inside one C call no Python
timeout can reach (found by fuzzing). The children are forked by a helper interpreter started once per
process, which imports nothing of the caller's (docs/formats.md).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any, Optional

from wbfe.errors import CorruptCheckpointError, WbfeError
from wbfe.sources.file_window import FileWindow

__all__ = ["WALK_TIMEOUT_S", "WALK_MEMORY_BYTES", "Hdf5IndexError", "Hdf5GuardError", "check_hdf5_index"]

# These bounds only stop a walk that would never end, or would take the machine's memory.
WALK_TIMEOUT_S = 20.0
WALK_MEMORY_BYTES = 1 << 30
# What the walker may add to a walk's timeout (a fork, a kill) before this process gives up on it.
_WALKER_SLACK_S = 15.0

_PASSED: dict[tuple[object, ...], bool] = {}
_MAX_REMEMBERED = 4096

_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
         "from wbfe.sources.hdf5_guard import _serve; _serve()")


class Hdf5IndexError(CorruptCheckpointError):
    def __init__(self, message: str, *, path: str, kind: str, text: str):
        super().__init__(message, path=path)
        self.kind, self.text = kind, text


class Hdf5GuardError(WbfeError, OSError):
    """The walker could not be started or stopped answering: the file was not read."""


class _Walker:
    def __init__(self) -> None:
        from multiprocessing import spawn  # the interpreter multiprocessing.set_executable() names

        self.process = subprocess.Popen(
            [spawn.get_executable(), "-c", _BOOT, json.dumps([p for p in sys.path if isinstance(p, str)])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, close_fds=True)
        self.pid = os.getpid()

    def ask(self, request: dict[str, Any], wait: float) -> Optional[dict[str, Any]]:
        """Send one request; the walker's answer, None after ``wait`` s (``EOFError``: the walker died)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except OSError:
            raise EOFError from None
        if not select.select([self.process.stdout], [], [], wait)[0]:
            return None
        line = self.process.stdout.readline()  # the walker writes an answer whole, then flushes
        if not line.endswith(b"\n"):
            raise EOFError
        return json.loads(line)

    def stop(self) -> None:
        """End the walker and the walk it may be running (they share its session)."""
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


_WALKER: Optional[_Walker] = None
_LOCK = threading.Lock()


def _forget_in_child() -> None:
    """A forked copy of this process starts its own walker (the two would mix answers on one pipe)."""
    global _WALKER, _LOCK
    walker, _WALKER, _LOCK = _WALKER, None, threading.Lock()
    if walker is not None:
        for pipe in (walker.process.stdin, walker.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    os.close(pipe.fileno())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def _stop_at_exit() -> None:
    if _WALKER is not None and _WALKER.pid == os.getpid():
        _WALKER.stop()


def _walker() -> Optional[_Walker]:
    global _WALKER
    if not hasattr(os, "fork"):
        return None
    if _WALKER is None or _WALKER.process.poll() is not None or _WALKER.pid != os.getpid():
        try:
            _WALKER = _Walker()
        except OSError as exc:
            raise Hdf5GuardError(f"the helper process that checks HDF5 files could not be started ({exc}); "
                                 "the file was not read") from None
    return _WALKER


def check_hdf5_index(path: Path, *, window: Optional[tuple[int, int]] = None, member: Optional[str] = None) -> None:
    """Walk the HDF5 index of ``path`` (or of its bytes ``window = (offset, size)``, or of its zip ``member``)
    in a bounded child process; return when it finished cleanly.

    Raises:
        CorruptCheckpointError: the walk timed out, ran out of memory or crashed: the file is damaged or hostile.
        Hdf5IndexError: libhdf5 refused the index (a damaged or truncated file).
        Hdf5GuardError: the walker could not be started, or died twice.
    """
    global _WALKER
    try:
        st = path.stat()
    except OSError:
        return  # the reader's own open reports it
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, window, member)
    if key in _PASSED:
        return
    what = f"{path}{f' ({member})' if member else ''}"
    request = {"path": str(Path(path).absolute()), "member": member, "window": list(window) if window else None,
               "memory": WALK_MEMORY_BYTES, "timeout": WALK_TIMEOUT_S}
    answer = None
    with _LOCK:
        for _ in range(2):  # a walker that died (killed from outside) is started once more
            walker = _walker()
            if walker is None:
                return
            try:
                answer = walker.ask(request, WALK_TIMEOUT_S + _WALKER_SLACK_S)
            except EOFError:
                walker.stop()
                _WALKER = None
                continue
            if answer is None:  # the walker did not stop the walk itself: both are ended
                walker.stop()
                _WALKER = None
                answer = {"status": "timeout"}
            break
    if answer is None:
        raise Hdf5GuardError(f"{what}: the helper process that checks HDF5 files died twice; the file was not read",
                             path=str(path))
    status = answer["status"]
    if status == "ok":
        if len(_PASSED) >= _MAX_REMEMBERED:
            _PASSED.clear()
        _PASSED[key] = True
        return
    kind, text = str(answer.get("kind", "")), str(answer.get("text", ""))
    if kind == "MemoryError" or "memory allocation failed" in text:
        status = "memory"
    failed = {"timeout": f"did not finish reading the file's index within {WALK_TIMEOUT_S:g} s",
              "memory": f"ran out of memory ({WALK_MEMORY_BYTES >> 20} MiB) reading the file's index",
              "crashed": f"crashed reading the file's index ({answer.get('exit')})"}
    if status in failed:
        raise CorruptCheckpointError(f"{what}: the HDF5 library {failed[status]}: the file is damaged or hostile",
                                     path=str(path))
    raise Hdf5IndexError(f"{what}: {text or kind}", path=str(path), kind=kind, text=text or kind)


def _serve() -> None:
    """The walker's loop: one JSON request a line on stdin, one JSON answer a line on stdout, until stdin closes."""
    import h5py  # noqa: F401 - imported once here, so that each forked child has it

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            answer = _bounded_walk(request["path"], request["member"], request["window"], int(request["memory"]),
                                   float(request["timeout"]))
        except Exception as exc:  # noqa: BLE001 - a malformed request gets an answer, not a dead walker
            answer = {"status": "error", "kind": type(exc).__name__, "text": str(exc)[:300]}
        try:
            out.write(json.dumps(answer).encode() + b"\n")
            out.flush()
        except BrokenPipeError:  # the process that asked is gone
            return


def _bounded_walk(path: str, member: Optional[str], window: Optional[list[int]], memory: int,
                  timeout: float) -> dict[str, Any]:
    receive, send = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the walker's loop
        try:
            os.close(receive)
            import resource

            used = _address_space()
            resource.setrlimit(resource.RLIMIT_AS, (used + memory, used + memory))
            if member:
                with zipfile.ZipFile(path) as archive, archive.open(member) as fh:
                    _walk(fh)
            else:
                _walk(FileWindow(path, window[0], window[1]) if window else path)
            verdict = {"status": "ok"}
        except MemoryError:  # its text is not asked for: that could allocate
            verdict = {"status": "error", "kind": "MemoryError", "text": ""}
        except BaseException as exc:  # noqa: BLE001 - every failure of the walk is the verdict
            verdict = {"status": "error", "kind": type(exc).__name__, "text": str(exc)[:300]}
        code = 70
        try:
            os.write(send, json.dumps(verdict).encode())
            code = 0
        finally:  # whatever happens, the child ends here
            os._exit(code)
    os.close(send)
    with os.fdopen(receive, "rb") as pipe:
        # The child writes its verdict (or, crashed, nothing) as it exits: once the pipe is readable, read to EOF.
        finished = bool(select.select([pipe], [], [], timeout)[0])
        data = pipe.read() if finished else b""
    if not finished:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if not finished:
        return {"status": "timeout"}
    if not data:
        how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit code {os.waitstatus_to_exitcode(status)}")
        return {"status": "crashed", "exit": how}
    return json.loads(data)


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
                with contextlib.suppress(TypeError, ValueError):  # a type h5py does not convert: no damage
                    obj.attrs.get(key)


def _address_space() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
