"""The one interface every checkpoint reader shares: a lazy stream of tensor entries."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

if TYPE_CHECKING:
    import torch

__all__ = ["TensorEntry", "Provenance", "TensorSource", "sha256_files", "FileDigest"]

_SHA256_NAME = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class TensorEntry:
    """One stored tensor, described before it is read.

    Attributes:
        name: the tensor name as stored (after unwrapping containers and a ``module.`` prefix).
        shape: its shape.
        dtype: a torch dtype name without the ``torch.`` prefix (``float32``, ``bfloat16``, ``int8``...).
        load: reads the tensor (memory-mapped where the format allows).
        storage_key: identifies shared storage (tied weights) where the format exposes it, else None.
        reread: gets the same tensor again later in the stream (after its shard is closed, too)
            without keeping anything else alive; None where only holding the tensor would allow it.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    load: Callable[[], "torch.Tensor"]
    storage_key: tuple[Any, ...] | None = None
    reread: Callable[[], "torch.Tensor"] | None = None


@dataclass
class Provenance:
    """Where the tensors came from.

    ``pending``: the files' SHA-256 while a background thread computes it; :meth:`digest` waits.
    """

    source: str
    format: str
    files: list[str] = field(default_factory=list)
    sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    pending: "FileDigest | None" = field(default=None, repr=False, compare=False)

    def digest(self) -> str | None:
        """The SHA-256 of the weight files (None for in-memory models), waiting for it if need be."""
        if self.pending is not None:
            self.sha256, self.pending = self.pending.result(), None
        return self.sha256

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "format": self.format,
            "files": list(self.files),
            "sha256": self.digest(),
        }
        out.update(self.extra)
        return out


class TensorSource:
    """A checkpoint opened for reading: iterate it for :class:`TensorEntry` values, one at a time.

    Use as a context manager; ``close()`` releases file handles and memory maps.
    """

    provenance: Provenance

    def entries(self) -> Iterator[TensorEntry]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Release resources; stop hashing the files if that is still under way."""
        if self.provenance.pending is not None:
            self.provenance.pending.cancel()

    def __enter__(self) -> "TensorSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FileDigest:
    """:func:`sha256_files` on a background thread, so that hashing overlaps the scoring.

    Hashing runs at ~1 GB/s, a tenth of a BFE-W-only score's time; hashlib and file reads release
    the GIL, so it costs nothing where BLAS leaves a core idle. :meth:`cancel` stops it early.
    """

    def __init__(self, paths: Sequence[Path]):
        self._stop = threading.Event()
        self._value: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(list(paths),), name="wbfe-sha256", daemon=True)
        self._thread.start()

    def _run(self, paths: list[Path]) -> None:
        if sys.platform == "linux":
            # Lowest priority for this thread alone (Linux treats a thread id as a process id here):
            # it then takes a core only when BLAS leaves one idle, and never slows the Gram products.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            self._value = sha256_files(paths, stop=self._stop)
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._error = exc

    def result(self) -> str:
        """The digest, once computed.

        Raises:
            Whatever hashing raised (an ``OSError`` for a file that went away), or
            ``RuntimeError`` after :meth:`cancel`.
        """
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def cancel(self) -> None:
        self._stop.set()


def sha256_files(paths: Sequence[Path], *, stop: threading.Event | None = None) -> str:
    """SHA-256 of one file's bytes, or of the sorted ``name:digest`` lines of several files.

    Raises:
        RuntimeError: ``stop`` was set before the files were read.
    """
    digests = []
    for path in paths:
        blob = path.resolve()
        if path.is_symlink() and _SHA256_NAME.fullmatch(blob.name):
            # Hugging Face cache: an LFS blob is stored under its own SHA-256; no need to re-read it.
            digests.append((path.name, blob.name))
            continue
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                if stop is not None and stop.is_set():
                    raise RuntimeError("hashing cancelled: the checkpoint was closed first")
                h.update(chunk)
        digests.append((path.name, h.hexdigest()))
    if len(digests) == 1:
        return digests[0][1]
    lines = "".join(f"{name}:{digest}\n" for name, digest in sorted(digests))
    return hashlib.sha256(lines.encode()).hexdigest()
