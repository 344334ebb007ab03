"""What a streamed safetensors reader needs of a remote file: byte ranges, each in one request, pinned to
the version first seen (:class:`wbfe.sources.http_range.RemoteFile`, :class:`wbfe.sources.store_range.StoreFile`)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["RangedFile"]


class RangedFile(Protocol):
    """Byte ranges of one remote file: ``head(n)`` its first ``min(n, size)`` bytes (pinning its identity and
    learning its size), ``read_bytes``/``read_into`` exactly the bytes asked for in one request, ``read_all(limit)``
    a small file whole (an index, a config), ``close()`` its connections (later reads may reopen them).

    Attributes:
        url, name: where the file is (what the provenance lists) and how messages name it.
        identity: what the store said of the version read (an ETag, a version id), pinned on first contact.
        commit: the repository commit it was served from (the hub's), else None.
        requests, bytes_fetched: read requests made and body bytes received (retries included).
    """

    url: str
    name: str
    size: int | None = None
    identity: str | None = None
    commit: str | None = None
    requests: int = 0
    bytes_fetched: int = 0

    def __str__(self) -> str:  # as messages name it (a shard's key in ShardedSafetensors.plan)
        return self.name

    def head(self, nbytes: int = ...) -> bytes: ...

    def read_bytes(self, start: int, nbytes: int) -> bytes:
        out = bytearray(nbytes)
        self.read_into(start, memoryview(out))
        return bytes(out)

    def read_into(self, start: int, into: memoryview) -> None: ...
    def read_all(self, limit: int) -> bytes: ...
    def close(self) -> None: ...
