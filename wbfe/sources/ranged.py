"""What a streamed safetensors reader needs of a remote file: byte ranges, each in one request, pinned to
the version first seen (:class:`wbfe.sources.http_range.RemoteFile`, :class:`wbfe.sources.store_range.StoreFile`)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["RangedFile"]


class RangedFile(Protocol):
    """Byte ranges of one remote file.

    Attributes:
        url, name: where the file is (what the provenance lists) and how messages name it.
        size: the file's size, known after the first read.
        identity: what the store said of the version read (an ETag, a version id), pinned on first contact.
        commit: the repository commit it was served from (the hub's), else None.
        requests, bytes_fetched: read requests made and body bytes received (retries included).
    """

    url: str
    name: str
    size: int | None
    identity: str | None
    commit: str | None
    requests: int
    bytes_fetched: int

    def head(self, nbytes: int = ...) -> bytes:
        """The first ``min(nbytes, size)`` bytes; pins the identity and learns the size."""
        ...

    def read_bytes(self, start: int, nbytes: int) -> bytes:
        """Exactly the bytes ``[start, start + nbytes)``, in one request."""
        ...

    def read_into(self, start: int, into: memoryview) -> None:
        """Fill ``into`` with exactly ``len(into)`` bytes from ``start`` on, in one request."""
        ...

    def read_all(self, limit: int) -> bytes:
        """The whole file when it holds at most ``limit`` bytes (an index, a config)."""
        ...

    def close(self) -> None:
        """Release connections (reads after it may reopen them)."""
        ...
