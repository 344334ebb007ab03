"""The one interface every checkpoint reader shares: a lazy stream of tensor entries."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

if TYPE_CHECKING:
    import torch

__all__ = ["TensorEntry", "Provenance", "TensorSource", "sha256_files"]

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
    """Where the tensors came from."""

    source: str
    format: str
    files: list[str] = field(default_factory=list)
    sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "format": self.format,
            "files": list(self.files),
            "sha256": self.sha256,
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
        """Release resources (default: nothing to release)."""

    def __enter__(self) -> "TensorSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sha256_files(paths: Sequence[Path]) -> str:
    """SHA-256 of one file's bytes, or of the sorted ``name:digest`` lines of several files."""
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
                h.update(chunk)
        digests.append((path.name, h.hexdigest()))
    if len(digests) == 1:
        return digests[0][1]
    lines = "".join(f"{name}:{digest}\n" for name, digest in sorted(digests))
    return hashlib.sha256(lines.encode()).hexdigest()
