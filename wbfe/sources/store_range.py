"""Byte ranges of one object in an fsspec store (``s3://``, ``gs://``, ...), one ``cat_file`` request per range, pinned
to the version first seen (where the store reports one and ``cat_file`` takes it; else checked with ``fs.info`` after
each read), with :class:`~wbfe.sources.http_range.RetryPolicy`'s retries (docs/remote.md)."""

from __future__ import annotations

import inspect
import json
import threading
import time
from typing import Any, Callable, Mapping

from wbfe.errors import RangeNotSupportedError, RemoteReadError, TruncatedCheckpointError, WbfeError
from wbfe.sources import http_range
from wbfe.sources.http_range import DOWNLOAD, FIRST_READ, RetryPolicy, changed, said
from wbfe.sources.object_store import object_identity
from wbfe.sources.ranged import RangedFile

__all__ = ["StoreFile"]

# (what fs.info calls a version, the keyword cat_file takes it as)
_VERSION_KEYS = (("VersionId", "version_id"), ("version_id", "version_id"), ("generation", "generation"))


class _Short(Exception):
    """An answer with other than the bytes asked for (retried)."""


class StoreFile(RangedFile):
    """Byte ranges of one fsspec object (a :class:`~wbfe.sources.ranged.RangedFile`), read by any thread.

    Args:
        info: ``fs.info``'s answer already at hand (of the store, not a cached listing): the first contact.

    Attributes:
        pinned: the version keyword every read passes (empty when the object is checked instead).
    """

    def __init__(self, fs: Any, path: str, url: str, *, info: Mapping[str, Any] | None = None,
                 policy: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep):
        self.fs, self.path, self.url, self.name = fs, path, url, url
        self.pinned: dict[str, Any] = {}
        self._known = dict(info) if info is not None else None
        try:
            self._takes: Mapping[str, Any] = inspect.signature(fs.cat_file).parameters
        except (TypeError, ValueError):
            self._takes = {}
        # gcsfs splits a range into several requests unless told not to
        self._one = {"concurrency": 1} if "concurrency" in self._takes else {}
        self._policy = policy or http_range.DEFAULT_POLICY
        self._sleep = sleep
        self._lock = threading.Lock()

    def head(self, nbytes: int = FIRST_READ) -> bytes:
        size = self._contact()
        if not self.pinned and size > nbytes and set(json.loads(self.identity or "{}")) <= {"size"}:
            raise RangeNotSupportedError.at(
                self.name, "the store reports nothing of the object but its size (no ETag, hash, time or version), "
                "so another upload of the same size between two reads would go unseen; " + DOWNLOAD)
        return self.read_bytes(0, min(nbytes, size))

    def read_into(self, start: int, into: memoryview) -> None:
        if len(into):
            self._fetch(start, into)

    def read_all(self, limit: int) -> bytes:
        """The whole object when it holds at most ``limit`` bytes, in one request."""
        size = self._contact()
        if size > limit:
            raise RemoteReadError.at(self.name, f"larger than {limit} bytes")
        return self.read_bytes(0, size)  # one read: nothing to check it against

    def close(self) -> None:
        """Nothing to release: the filesystem owns its connections."""

    def _info(self) -> dict[str, Any]:
        self.fs.invalidate_cache(self.path)
        info = dict(self.fs.info(self.path))
        if info.get("type", "file") != "file":
            raise RemoteReadError.at(self.name, "not a file")
        return info

    def _contact(self) -> int:
        """Pin the identity (once) and return the size."""
        if self.size is not None:
            return self.size
        info = self._known or self._retrying("the object's description", self._info, first=True)
        with self._lock:
            if self.size is None:
                self.size = int(info.get("size") or 0)
                self.identity = json.dumps(object_identity(info), sort_keys=True)
                # the keyword that makes cat_file read this version ({}: checked after each read instead)
                self.pinned = next(({keyword: info[field]} for field, keyword in _VERSION_KEYS
                                    if info.get(field) not in (None, "", "null") and keyword in self._takes), {})
        if self.size == 0:
            raise TruncatedCheckpointError.at(self.name, "empty file")
        return self.size

    def _fetch(self, start: int, into: memoryview) -> None:
        size = self._contact()
        nbytes = len(into)
        if start < 0 or start + nbytes > size:
            raise TruncatedCheckpointError.at(self.name, f"bytes {start}-{start + nbytes - 1} lie past its end "
                                              f"({size} bytes)")

        def attempt() -> None:
            data = self.fs.cat_file(self.path, start=start, end=start + nbytes, **self.pinned, **self._one)
            with self._lock:
                self.requests += 1
                self.bytes_fetched += len(data)
            if not self.pinned:  # before a byte is used: this answer came from the pinned version (gone: "changed")
                now = json.dumps(object_identity(self._info()), sort_keys=True)
                if now != self.identity:
                    raise changed(self.name, f"its identity went from {self.identity} to {now}")
            if len(data) != nbytes:
                raise _Short(f"asked for {nbytes} bytes from byte {start}, got {len(data)}")
            into[:] = data

        self._retrying(f"bytes {start}-{start + nbytes - 1}", attempt)

    def _retrying(self, what: str, action: Callable[[], Any], *, first: bool = False) -> Any:
        policy = self._policy
        last = ""
        for attempt in range(policy.attempts):
            try:
                return action()
            except WbfeError:  # a verdict (a changed object): never retried
                raise
            except FileNotFoundError:
                if first:
                    raise RemoteReadError.at(self.name, "no such object") from None
                raise changed(self.name, "it is gone") from None
            except PermissionError as exc:
                raise RemoteReadError.at(self.name, f"access refused ({said(exc)}); the store's credentials "
                                         "must allow reading it") from None
            except (_Short, OSError) as exc:  # ConnectionError and TimeoutError are OSErrors too
                last = said(exc)
                if attempt + 1 < policy.attempts:
                    self._sleep(policy.delay(attempt))
            except Exception as exc:  # noqa: BLE001 - a store's own error type: a verdict, in one line
                raise RemoteReadError.at(self.name, f"{what} cannot be read ({said(exc)})") from None
        raise RemoteReadError.at(self.name, f"{what} could not be read in {policy.attempts} tries (last: {last})")
