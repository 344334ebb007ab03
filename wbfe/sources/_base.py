"""The one interface every checkpoint reader shares: a lazy stream of tensor entries."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from wbfe.errors import CorruptCheckpointError, SourceNotFoundError
from wbfe.framework import OUT_IN, Fallback, FrameworkDescription, describe_config
from wbfe.framework.config_layouts import conv1d_family, rule_layout
from wbfe.linalg.arrays import itemsize
from wbfe.render.files import file_kind

__all__ = ["TensorEntry", "Provenance", "TensorSource", "FileDigest", "open_regular", "unreadable",
    "TORCH_SUFFIXES", "HASH_CHUNK", "file_sha256", "combine_digests", "stored_bytes"]

# PyTorch pickle suffixes (the list of every format's suffixes is wbfe.sources.WEIGHT_SUFFIXES).
TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".th", ".ckpt")
# Read size of the hashing (a larger buffer's zero fill costs a small model's score).
HASH_CHUNK = 1 << 18


@dataclass(frozen=True)
class TensorEntry:
    """One stored tensor, described before it is read.

    Attributes:
        name: the tensor name as stored (after unwrapping containers and a ``module.`` prefix).
        dtype: a torch dtype name without the ``torch.`` prefix (``float32``, ``bfloat16``, ``int8``...).
        load: reads the tensor: a numpy array where numpy has its dtype and the reader is not torch's
            own, else a torch tensor (:mod:`wbfe.linalg.arrays` takes either).
        storage_key: identifies shared storage (tied weights) where the format exposes it, else None.
        quant: the storage scheme of a tensor ``load`` dequantises (``gguf-q4_k``...); ``dtype`` is
            then the dtype ``load`` returns.
        skip: why the tensor is not read as a dense matrix (listed as skipped; ``load`` never called).
        layout: ``out_in`` ([out, in, k...], PyTorch's) or ``in_out`` (stored transposed: GPT-2's
            Conv1D, a transposed convolution), as the reader or the checkpoint's description says.
        copy_of: the ``name`` of a skipped row ``shard/name``: a second copy of a tensor that a shard index gives
            to another shard (what writes a checkpoint refuses it: either copy may be the one meant).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    load: Callable[[], Any]
    storage_key: tuple[Any, ...] | None = None
    quant: str | None = None
    skip: str | None = None
    layout: str = OUT_IN
    copy_of: str | None = None

    @property
    def nbytes(self) -> int:
        """The bytes of the tensor ``load`` returns (its elements times its dtype's size)."""
        return stored_bytes(self.shape, self.dtype)


def stored_bytes(shape: Sequence[int], dtype: str) -> int:
    """The bytes of a tensor of ``shape`` and ``dtype`` (a torch dtype name)."""
    return math.prod(int(size) for size in shape) * itemsize(dtype)


def open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file (a FIFO or device would block a read).

    Raises:
        SourceNotFoundError: the file does not exist or cannot be read (permissions, I/O error).
        CorruptCheckpointError: the path is not a regular file (its ``kind``: "a folder", "a FIFO"...).
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise unreadable(path, exc) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = file_kind(mode)
            raise CorruptCheckpointError.at(path, f"not a regular file ({kind}); wbfe reads checkpoint files only",
                                            kind=kind)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        fh = os.fdopen(fd, "rb")
        fh.raw.name = str(path)  # type: ignore[attr-defined]  # as open() would name it, for messages
        return fh
    except BaseException:
        os.close(fd)
        raise


def missing(path: Path | str, hint: str = "") -> SourceNotFoundError:
    """The typed error for a path that is not there: a dangling or looping symbolic link says so."""
    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return SourceNotFoundError.at(path, "a symbolic link in a loop (it never reaches a file)")
            return SourceNotFoundError.at(path, f"a symbolic link to {os.readlink(path)}, which does not exist")
    return SourceNotFoundError(f"no such file or folder: {path}{hint}", path=str(path))


def unreadable(path: Path | str, exc: OSError) -> SourceNotFoundError:
    """The typed error for an ``OSError`` met while opening or reading ``path``."""
    if exc.errno in (errno.ENOENT, errno.ELOOP):
        return missing(path)
    if exc.errno == errno.ENAMETOOLONG:
        return SourceNotFoundError(f"{str(path)[:200]}...: file name too long", path=str(path))
    reason = exc.strerror or exc.__class__.__name__
    return SourceNotFoundError.at(path, f"cannot be read ({reason})")


@dataclass
class Provenance:
    """Where the tensors came from; ``pending``: the files' SHA-256, computed when first asked for."""

    source: str
    format: str
    files: list[str] = field(default_factory=list)
    sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    pending: "FileDigest | None" = field(default=None, repr=False, compare=False)

    def digest(self) -> str | None:
        """The SHA-256 of the weight files (None for in-memory models), hashing them if need be."""
        if self.pending is not None:
            self.sha256, self.pending = self.pending.result(), None
        return self.sha256

    def to_dict(self) -> dict[str, Any]:
        """The JSON's ``model`` block, with a URL's credentials hidden (:func:`without_credentials`)."""
        extra = dict(self.extra)
        if isinstance(extra.get("etags"), dict):  # keyed by the URLs read (wbfe.sources.remote)
            extra["etags"] = {without_credentials(url): etag for url, etag in extra["etags"].items()}
        return {"source": without_credentials(self.source), "format": self.format,
                "files": [without_credentials(f) for f in self.files], "sha256": self.digest(), **extra}


def without_credentials(ref: str) -> str:
    """``ref`` with a URL's query values and password written ``REDACTED`` (a pre-signed URL's signature, a token):
    a score JSON is shared, the credentials that read its checkpoint must not be."""
    from urllib.parse import parse_qsl, urlencode, urlsplit

    try:
        parts = urlsplit(ref)
    except ValueError:
        return ref
    if "://" not in ref or not (parts.query or parts.password):
        return ref
    netloc = parts.netloc.replace(f":{parts.password}@", ":REDACTED@") if parts.password else parts.netloc
    query = urlencode([(k, "REDACTED") for k, _ in parse_qsl(parts.query, keep_blank_values=True)], safe="")
    return parts._replace(netloc=netloc, query=query).geturl()


class TensorSource:
    """A checkpoint opened for reading (a context manager): :meth:`entries` yields :class:`TensorEntry` values."""

    provenance: Provenance
    # The head's tensor name as the format or config declares it (read after ``entries()`` ends).
    head_hint: str | None = None
    # The model's parsed ``config.json`` found beside the weights, else None.
    config: dict[str, Any] | None = None
    # entries() reads headers only: they can be listed before any is scored (progress's total up front).
    headers_only: bool = False
    # The description a reader took from the file itself (a Keras model_config, a GGUF tensor list).
    own_description: FrameworkDescription | None = None
    _described: tuple[Any, FrameworkDescription | None] | None = None

    @property
    def description(self) -> FrameworkDescription | None:
        """The reader's ``own_description``, else the one built from ``config``; None where there is none
        (what was used, or why the rules decide, is recorded in ``provenance.extra["framework"]``)."""
        if self.own_description is not None:
            self.provenance.extra["framework"] = self.own_description.summary()
            return self.own_description
        if self.config is None:
            return None
        if self._described is None or self._described[0] is not self.config:
            found = describe_config(self.config)
            if isinstance(found, Fallback):
                self.provenance.extra["framework"] = {"used": "rules", "why": str(found)}
            elif found is not None:
                self.provenance.extra["framework"] = found.summary()
            self._described = (self.config, found if isinstance(found, FrameworkDescription) else None)
        return self._described[1]

    def leave_to_rules(self, why: str | None) -> None:
        """Let wbfe's rules decide instead of the ``config``'s framework (``why`` recorded); None undoes it."""
        self.provenance.extra.pop("framework", None)
        self._described = None if why is None else (self.config, None)
        if why is not None:
            self.provenance.extra["framework"] = {"used": "rules", "why": why}

    def described(self, entries: Iterator[TensorEntry]) -> Iterator[TensorEntry]:
        """``entries`` with the layout the checkpoint's description gives each (GPT-2's Conv1D: ``in_out``)."""
        description = self.description
        layouts = description.layouts if description is not None else {}
        # Without a description (no torch, no transformers), the config's rule still knows GPT-2's Conv1D
        rule = description is None and conv1d_family(self.config) is not None
        if rule and isinstance(self.provenance.extra.get("framework"), dict):
            self.provenance.extra["framework"]["layouts"] = (
                f"config rule: the Conv1D weights of a {conv1d_family(self.config)} model (c_attn, q_attn, c_proj, "
                "c_fc) are stored [in, out]")
        for entry in entries:
            layout = rule_layout(self.config, entry.name) if rule else layouts.get(entry.name)
            yield entry if layout is None or layout == entry.layout else dataclasses.replace(entry, layout=layout)

    def entries(self) -> Iterator[TensorEntry]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Release resources. The files' SHA-256 may still be asked for: it is read from their paths."""

    def __enter__(self) -> "TensorSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FileDigest:
    """SHA-256 of one file, or of the sorted ``name:digest`` lines of several, computed when it is asked for
    (from the paths: before or after the checkpoint is closed)."""

    def __init__(self, paths: Sequence[Path]):
        self._paths = list(paths)

    def result(self) -> str:
        """The digest (raises what hashing raised: ``SourceNotFoundError`` for a file removed since)."""
        buffer = bytearray(HASH_CHUNK)
        return combine_digests([file_sha256(path, buffer) for path in self._paths])


def file_sha256(path: Path, buffer: bytearray) -> tuple[str, str]:
    """``(file name, hex SHA-256)`` of one file, read through ``buffer``."""
    h = hashlib.sha256()
    view = memoryview(buffer)
    try:  # a file removed or made unreadable since it was opened
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buffer):
                h.update(view[:n])
    except OSError as exc:
        raise unreadable(path, exc) from None
    return path.name, h.hexdigest()


def combine_digests(digests: Sequence[tuple[str, str]]) -> str:
    """The one digest of one file, else the SHA-256 of the sorted ``name:digest`` lines (as :class:`FileDigest`)."""
    if len(digests) == 1:
        return digests[0][1]
    lines = "".join(f"{name}:{digest}\n" for name, digest in sorted(digests))
    return hashlib.sha256(lines.encode()).hexdigest()

