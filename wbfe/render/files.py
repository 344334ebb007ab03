"""Writing result files: the one place wbfe creates or replaces a file the user named (and its cache entries).
Every write is atomic, every output checked before any work starts (docs/cli.md, Outputs)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
import sys
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Optional, Union

from wbfe._config import user_path
from wbfe.errors import OutputError, OverwriteError
from wbfe.render.text import json_ready

__all__ = ["STDOUT_PATHS", "is_devnull", "check_output", "check_output_dir", "write_atomic", "open_atomic",
           "write_output", "write_json", "local_reads", "local_files", "refuse_overlap", "json_sha256", "file_kind"]

STDOUT_PATHS = ("-", "/dev/stdout", "/dev/fd/1")
STDERR_PATHS = ("/dev/stderr", "/dev/fd/2")  # the process's own stream, not the device it points to
_STREAMS = STDOUT_PATHS + STDERR_PATHS
_FILE_SUFFIXES = (".json", ".csv", ".png", ".html", ".htm", ".md", ".txt")  # what no new results folder is named

PathLike = Union[str, "os.PathLike[str]"]
Reads = Iterable[PathLike]

_KINDS = {stat.S_IFREG: "a file", stat.S_IFDIR: "a folder", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for a message: "a file", "a folder", "a FIFO", ..., "a special file"."""
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


def _path_text(path: Any) -> str:
    """``path`` as text; OutputError for an empty one or a non-path (None, a number, bytes)."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise OutputError(f"the output must be a file name, not {path!r}")
    if not text.strip():
        raise OutputError(f"the output path is empty ({text!r})")
    return text


def is_devnull(st: os.stat_result) -> bool:
    """Whether ``st`` describes the null device (the same character device as :data:`os.devnull`)."""
    try:
        null = os.stat(os.devnull)
    except OSError:  # pragma: no cover - a system without /dev/null
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev


def local_reads(ref: Any) -> tuple[Path, ...]:
    """The local files and folders that reading the checkpoint reference ``ref`` reads: a file, a
    folder, or an index file with its folder (where its shards are resolved). Empty for a hub id, a
    URL, an in-memory model or a path that does not exist (nothing local to protect)."""
    text = os.fspath(ref) if isinstance(ref, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text.strip() or "://" in text:
        return ()
    path = user_path(text)
    if not path.exists():
        return ()
    return (path, path.parent) if path.is_file() and path.name.lower().endswith(".index.json") else (path,)


def local_files(files: Any) -> list[Path]:
    """The local files among ``files`` (a provenance's ``files``: what a reader resolved while
    opening, such as an index's shards or a hub cache's snapshot files); URLs are left out."""
    if not isinstance(files, (list, tuple)):
        return []
    return [Path(f) for f in files if isinstance(f, str) and "://" not in f and f.strip() and Path(f).exists()]


def _real(path: PathLike) -> Path:
    """Where a write to ``path`` lands: symbolic links followed, even a dangling one's target."""
    return Path(os.path.realpath(user_path(os.fspath(path))))


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def refuse_overlap(path: PathLike, reads: Reads) -> None:
    """Refuse to write ``path`` (a file, or a folder to write files into) over or into what the command reads: a
    file of ``reads`` (the same real path, or the same device and inode: a hard link) or anything inside a folder.

    Raises:
        OverwriteError: one line that names the input and says what to write instead.
    """
    reads = list(reads)
    # Nothing read: a bad path is refused by the caller's own check.
    if reads and (shown := _path_text(path)) not in _STREAMS:
        _refuse_overlap(shown, _real(shown), reads)


def _refuse_overlap(shown: str, target: Path, reads: list[PathLike]) -> None:
    """:func:`refuse_overlap` of the output ``shown`` (checked text), which lands in ``target``."""
    if not reads:  # no input to compare: no status to take
        return
    # The target and its existing ancestors with their status: a bind mount or a case-insensitive file
    # system can give one folder two real paths, and the inode says it is the same.
    chain: list[tuple[Path, os.stat_result]] = []
    for p in (target, *target.parents):
        with suppress(OSError):
            chain.append((p, p.stat()))
    for read in reads:
        real = _real(read)
        try:
            st = real.stat()
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            same = [p for p, s in chain if _same(s, st)]
            if target == real or real in target.parents or same:
                where = "" if target == real or (same and same[0] == target) else "inside "
                raise OverwriteError(f"cannot write {shown}: it is {where}{os.fspath(read)}, a folder this command "
                                     "reads; write the output outside the checkpoint folder",
                                     path=shown, input=os.fspath(read))
        elif chain and chain[0][0] == target and (target == real or _same(chain[0][1], st)):
            how = f"the input {os.fspath(read)} itself" if target == real else f"a hard link to the input {read}"
            raise OverwriteError(f"cannot write {shown}: it is {how}; wbfe never writes over what it reads: "
                                 "name another output file", path=shown, input=os.fspath(read))


def check_output(path: PathLike, *, reads: Reads = ()) -> Optional[Path]:
    """The file a result for ``path`` will be written to; None for standard output or error. Called before
    any work starts. ``reads``: the local files and folders the command reads (:func:`local_reads`), which
    the output may not be nor lie inside (:func:`refuse_overlap`).

    Raises:
        OutputError: an empty path, a target that is not a regular file, a file or folder the user
            may not write. OverwriteError: an output over or inside what the command reads.
    """
    text = _path_text(path)
    if text in _STREAMS:
        return None
    target, st = _status(text, path, reads)
    if st is not None and is_devnull(st):
        return target
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"cannot write {text}: it is {file_kind(st.st_mode)}, not a regular file", path=str(path))
    if st is not None and not os.access(target, os.W_OK):
        raise OutputError(f"cannot write {text}: permission denied", path=str(path))
    _probe(target if st is None else target.parent, path)
    return target


def _status(text: str, path: PathLike, reads: Reads, into: str = "") -> tuple[Path, Optional[os.stat_result]]:
    """Where the output ``text`` lands (refused over what is read), and its status: None where absent."""
    target = _real(text)
    _refuse_overlap(text, target, list(reads))
    try:
        return target, target.stat()
    except FileNotFoundError:
        return target, None
    except OSError as exc:  # a name too long for the file system, a loop of links
        raise OutputError(f"cannot write {into}{text}: {exc.strerror or exc}", path=str(path)) from None


def _probe(folder: Path, path: PathLike, into: str = "") -> None:
    """Create and remove an empty file in ``folder`` or its nearest existing ancestor: permission bits say too
    little (root passes every check, an immutable folder or a read-only file system refuses anyway); the names
    still to be made must fit that file system."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder.name)
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"cannot write {into}{os.fspath(path)}: {folder} is not a folder", path=str(path))
    # Else the folders are made, and refused, only when the results are written.
    if any(len(os.fsencode(name)) > os.pathconf(folder, "PC_NAME_MAX") for name in missing):
        raise OutputError(f"cannot write {into}{os.fspath(path)}: {os.strerror(errno.ENAMETOOLONG)}", path=str(path))
    probe = folder / f".wbfe-probe.{secrets.token_hex(6)}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise OutputError(f"cannot write {os.fspath(path)}: folder {folder} is not writable "
                          f"({exc.strerror or exc})", path=str(path)) from None
    with suppress(OSError):
        probe.unlink()


def check_output_dir(path: PathLike, *, reads: Reads = ()) -> Path:
    """A folder results will be written into (created when absent).

    Raises:
        OutputError: an empty path, something other than a folder, or a folder that is not writable.
            OverwriteError: a folder the command reads, or one inside it (``reads`` as for
            :func:`check_output`).
    """
    text = _path_text(path)
    if text in _STREAMS:  # "-" was made a folder of that name
        raise OutputError(f"cannot write into {text}: the results are several files; give a folder", path=str(path))
    folder, st = _status(text, path, reads, "into ")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write into {text}: it is {file_kind(st.st_mode)}, not a folder", path=str(path))
    suffix = folder.suffix.lower()
    if st is None and suffix in _FILE_SUFFIXES:  # -o c.json made a folder c.json (an existing one is the user's)
        raise OutputError(f"cannot write into {text}: the results are several files; name a folder, not a {suffix} "
                          "file", path=str(path))
    _probe(folder, path, "into ")
    return folder


def write_atomic(path: PathLike, data: Union[str, bytes], *, reads: Reads = ()) -> Path:
    """Replace the file at ``path`` (through symbolic links) with ``data``, atomically, creating its folders;
    returns the file written (a link's target). An existing file keeps its permission bits; a new one
    gets 0666 less the umask, as from a plain ``open``.

    Raises:
        OutputError: as :func:`open_atomic`.
    """
    reads = list(reads)
    target = check_output(path, reads=reads)
    if target is None:
        raise OutputError("write_atomic() cannot write to standard output; use write_output()")
    view = memoryview(data.encode("utf-8") if isinstance(data, str) else bytes(data))
    with open_atomic(target, reads=reads) as fh:  # nothing buffered yet: os.write goes straight to the file
        while view:  # the whole payload through the file descriptor: a short write is continued
            view = view[os.write(fh.fileno(), view):]
    return target


@contextmanager
def open_atomic(path: PathLike, *, reads: Reads = ()) -> Iterator[BinaryIO]:
    """A binary file to stream a result into: it replaces ``path`` atomically when the block ends, and is
    removed, leaving ``path`` unchanged, when the block raises (the null device is written directly).
    ``reads`` as for :func:`check_output`; a writer that learns of more inputs while it works checks
    them with :func:`refuse_overlap` before the block ends, so a refused output is never half-written.

    Raises:
        OutputError: as :func:`check_output`, or the write failed (disk full, read-only or
            immutable file, ...); the target is then unchanged and no temporary file is left.
    """
    target = check_output(path, reads=reads)
    if target is None:
        raise OutputError("open_atomic() cannot write to standard output")
    if target.exists() and is_devnull(target.stat()):
        with open(target, "wb") as sink:
            yield sink
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        existing = target.stat().st_mode if target.exists() else None
        tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise OutputError(f"cannot write {os.fspath(path)}: {exc.strerror or exc}", path=str(path)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if existing is not None:
                os.fchmod(fh.fileno(), stat.S_IMODE(existing))
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            reason = "the file is immutable or read-only" if exc.errno in (errno.EPERM, errno.EACCES) else (
                exc.strerror or str(exc))
            raise OutputError(f"cannot write {os.fspath(path)}: {reason}", path=str(path)) from None
        raise
    # The rename is durable only once the folder's entry is on disk; best effort (not every
    # file system lets a folder be opened for fsync).
    with suppress(OSError):
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_output(path: PathLike, text: str, *, reads: Reads = ()) -> Optional[Path]:
    """Write ``text`` to ``path``, or to standard output (``-``) or error; returns the file (None for a stream).
    ``reads``: as for :func:`check_output`."""
    if os.fspath(path) in _STREAMS:
        stream = sys.stdout if os.fspath(path) in STDOUT_PATHS else sys.stderr
        stream.write(text)
        stream.flush()
        return None
    return write_atomic(path, text, reads=reads)


def write_json(path: PathLike, obj: Any, *, indent: Optional[int] = 2) -> Optional[Path]:
    """Standard JSON of ``obj`` (non-finite numbers as ``null``) to ``path`` or standard output."""
    return write_output(path, json.dumps(json_ready(obj), indent=indent, allow_nan=False) + "\n")


def json_sha256(obj: Any, *, default: Optional[Callable[[Any], Any]] = None) -> str:
    """Hex SHA-256 of ``obj`` as canonical JSON (keys sorted, no spaces, no NaN): a cache entry's key or checksum."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, default=default)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

