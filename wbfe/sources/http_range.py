"""HTTP range reads of one remote file, pinned to the version first seen, with bounded retries.

A :class:`RemoteFile` reads byte ranges of a URL (a Hugging Face resolve URL, any HTTP server that
honours ``Range``), one request per range. Every answer is checked before a byte of it is used:
status 206, a ``Content-Range`` with exactly the start, end and total asked for, a body of exactly
that length, and the identity (``ETag``, else ``Last-Modified``; the hub's ``X-Repo-Commit``)
pinned on first contact. A file that changes between two requests raises
:class:`~wbfe.errors.RemoteChangedError` (a strong ``ETag`` is also sent as ``If-Match``, so a
server that knows says 412 at once): tensors of two versions are never mixed in one score.

Connection errors, 5xx, 429 (``Retry-After`` honoured up to a bound), short bodies, a wrong
``Content-Range`` and a body slower than :attr:`RetryPolicy.min_rate` are retried with an
exponential back-off of fixed steps (no jitter: the same failure gives the same schedule), a
bounded number of times. 404 and 401/403 are not retried: a one-line error names the file (and,
for 401/403, the token it needs). A server that ignores ``Range`` (200 with the whole file) is
never read into memory: :class:`~wbfe.errors.RangeNotSupportedError`.

Only the standard library's ``http.client`` is used, so timeouts, redirects and byte counts are
all in view here; the request headers (user agent, a hub token) come from the caller.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import urljoin, urlsplit

from wbfe.errors import (RangeNotSupportedError, RemoteChangedError, RemoteReadError, TruncatedCheckpointError,
                         WbfeError)

__all__ = ["RetryPolicy", "RemoteFile", "DEFAULT_POLICY", "FIRST_READ"]

# The first request of a file asks for this many bytes: most safetensors headers fit (a 70B model's
# shard header is ~40 KB), so the header costs one request, else two.
FIRST_READ = 1 << 16
_CHUNK = 1 << 20  # bytes per socket read: the deadline is checked between reads
_REDIRECTS = 5
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.I)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard a range read tries.

    Attributes:
        attempts: tries per request (the first included).
        backoff: the wait before the first retry, in seconds; doubled before each next one.
        backoff_max: the longest wait between two tries.
        retry_after_max: the longest ``Retry-After`` obeyed (a longer one is cut to this).
        timeout: seconds a connection, or one socket read, may wait.
        min_rate: bytes per second under which a body is cut and retried (a trickle), on top of
            ``timeout`` seconds of grace.
    """

    attempts: int = 6
    backoff: float = 0.5
    backoff_max: float = 20.0
    retry_after_max: float = 60.0
    timeout: float = 30.0
    min_rate: float = 50_000.0

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first), or the server's
        ``Retry-After`` within :attr:`retry_after_max`."""
        if retry_after is not None:
            return max(0.0, min(retry_after, self.retry_after_max))
        return min(self.backoff * (2 ** retry), self.backoff_max)


DEFAULT_POLICY = RetryPolicy()


class _Retry(Exception):
    """A failure worth another try (the message says what went wrong)."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class RemoteFile:
    """Byte ranges of one remote file, read by any thread, each in one request.

    Args:
        url: the file's URL (http or https).
        headers: sent with every request to the URL's own host (a hub token, the user agent);
            ``Authorization`` is dropped on a redirect to another host.
        policy: the retries and timeouts.
        name: how messages name the file (default: the URL).
        sleep: the wait between tries (tests record it instead).

    Attributes:
        size: the file's size, known after the first read.
        identity: the ``ETag`` (else ``Last-Modified``) pinned on first contact.
        commit: the hub commit (``X-Repo-Commit``) pinned on first contact, when the server sends one.
        requests, bytes_fetched: counts of range requests made and body bytes received.
    """

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None, policy: RetryPolicy | None = None,
                 name: str | None = None, sleep: Callable[[float], None] = time.sleep):
        self.url = url
        self.name = name or url
        self.size: int | None = None
        self.identity: str | None = None
        self.commit: str | None = None
        self.requests = 0
        self.bytes_fetched = 0
        self._headers = dict(headers or {})
        self._policy = policy or DEFAULT_POLICY
        self._sleep = sleep
        self._lock = threading.Lock()  # pinning and the counters
        self._local = threading.local()  # one kept-alive connection per thread and host
        self._conns: list[http.client.HTTPConnection] = []  # all of them, for close()

    # ------------------------------------------------------------------ public reads

    def head(self, nbytes: int = FIRST_READ) -> bytes:
        """The file's first ``min(nbytes, size)`` bytes; pins its identity and learns its size."""
        out = bytearray(nbytes)
        got = self._fetch(0, nbytes, memoryview(out), first=True)
        return bytes(out[:got])

    def read_bytes(self, start: int, nbytes: int) -> bytes:
        """Exactly the bytes ``[start, start + nbytes)`` (within the file), in one request."""
        out = bytearray(nbytes)
        if nbytes:
            self._fetch(start, nbytes, memoryview(out))
        return bytes(out)

    def read_into(self, start: int, into: memoryview) -> None:
        """Fill ``into`` with the bytes from ``start`` on (exactly ``len(into)``), in one request."""
        if len(into):
            self._fetch(start, len(into), into)

    def close(self) -> None:
        """Close every thread's connections (one in use fails its read, which is retried on a new
        one: http.client reopens a closed connection)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local.conns = {}

    def _close_mine(self) -> None:
        """Close this thread's connections (after a failure: the next try starts afresh)."""
        mine = list(getattr(self._local, "conns", {}).values())
        for conn in mine:
            conn.close()
        self._local.conns = {}
        with self._lock:
            self._conns = [conn for conn in self._conns if conn not in mine]

    # ------------------------------------------------------------------ one range, with retries

    def _fetch(self, start: int, nbytes: int, into: memoryview, *, first: bool = False) -> int:
        policy = self._policy
        last = ""
        for attempt in range(policy.attempts):
            try:
                return self._attempt(start, nbytes, into, first)
            except _Retry as exc:
                last = str(exc)
                self._close_mine()
                if attempt + 1 < policy.attempts:
                    self._sleep(policy.delay(attempt, exc.retry_after))
            except WbfeError:  # a verdict (404, a changed file), some of them OSErrors too: never retried
                self._close_mine()
                raise
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, cut short
                last = f"{exc.__class__.__name__}: {' '.join(str(exc).split())[:200]}" if str(exc) else \
                    exc.__class__.__name__
                self._close_mine()
                if attempt + 1 < policy.attempts:
                    self._sleep(policy.delay(attempt))
            except BaseException:
                self._close_mine()
                raise
        raise RemoteReadError(f"{self.name}: bytes {start}-{start + nbytes - 1} could not be read in "
                              f"{policy.attempts} tries (last: {last})", path=self.name)

    def _attempt(self, start: int, nbytes: int, into: memoryview, first: bool) -> int:
        policy = self._policy
        began = time.monotonic()
        headers = {**self._headers, "Range": f"bytes={start}-{start + nbytes - 1}", "Accept-Encoding": "identity"}
        if self.identity is not None and not self.identity.startswith("W/") and self.identity.startswith('"'):
            headers["If-Match"] = self.identity
        response, seen_commit = self._open(headers)
        with self._lock:
            self.requests += 1
        status = response.status
        if status in (404, 410):
            raise RemoteReadError(f"{self.name}: not found (HTTP {status})", path=self.name)
        if status in (401, 403):
            raise RemoteReadError(
                f"{self.name}: access refused (HTTP {status}); a token with access is needed: set HF_TOKEN "
                "(or run hf auth login) for the Hugging Face hub", path=self.name)
        if status == 412:
            raise self._changed("its ETag no longer matches (HTTP 412)")
        if status == 416:
            if self.size is not None:
                raise self._changed(f"it no longer holds bytes {start}-{start + nbytes - 1} (HTTP 416)")
            raise TruncatedCheckpointError(f"{self.name}: empty file (HTTP 416)", path=self.name)
        if status == 429 or 500 <= status < 600:
            raise _Retry(f"HTTP {status}", _retry_after(response.getheader("Retry-After")))
        if status not in (200, 206):
            raise RemoteReadError(f"{self.name}: the server answered HTTP {status}", path=self.name)
        self._pin(response, seen_commit, first)
        length = _int(response.getheader("Content-Length"))
        if status == 200:
            # The whole file: use it only where the whole file is what was asked for (a small file's
            # first read); never pull a whole checkpoint through a request for one tensor.
            if start != 0 or length is None or length > nbytes:
                response.close()
                raise RangeNotSupportedError(
                    f"{self.name}: the server ignores HTTP range requests (it answered 200 with the whole file), "
                    "so it cannot be streamed; score it without --stream to download it first", path=self.name)
            total, expected = length, length
        else:
            match = _CONTENT_RANGE.match(response.getheader("Content-Range") or "")
            if match is None or match.group(3) == "*":
                raise _Retry(f"a 206 answer without a valid Content-Range ({_shown(response, 'Content-Range')})")
            first_byte, last_byte, total = int(match.group(1)), int(match.group(2)), int(match.group(3))
            if self.size is not None and total != self.size:
                raise self._changed(f"its size went from {self.size} to {total} bytes")
            expected = min(nbytes, total - start)
            if first_byte != start or last_byte != start + expected - 1 or expected <= 0:
                raise _Retry(f"asked for bytes {start}-{start + nbytes - 1}, the answer holds "
                             f"{first_byte}-{last_byte}/{total}")
            if length is not None and length != expected:
                raise _Retry(f"a Content-Length of {length} for {expected} bytes")
            if not first and expected != nbytes:
                raise self._changed(f"it ends before byte {start + nbytes}")
        with self._lock:
            if self.size is None:
                self.size = total
        deadline = began + policy.timeout + expected / policy.min_rate
        got = 0
        while got < expected:
            # read1: what one socket read brings (a readinto would wait for its whole buffer, so a
            # trickle that keeps each read under the timeout would never meet the deadline).
            chunk = response.read1(min(expected - got, _CHUNK))
            n = len(chunk)
            if not n:
                raise _Retry(f"short read: {got} of {expected} bytes")
            into[got:got + n] = chunk
            got += n
            with self._lock:
                self.bytes_fetched += n
            if time.monotonic() > deadline and got < expected:
                raise _Retry(f"too slow: {got} of {expected} bytes in {time.monotonic() - began:.1f} s")
        # Ends the answer (read1 never marks it done), so that the connection takes the next request.
        if response.read(1):
            raise _Retry(f"a body longer than the {expected} bytes asked for")
        return got

    # ------------------------------------------------------------------ requests and identity

    def _open(self, headers: dict[str, str]) -> tuple[http.client.HTTPResponse, str | None]:
        """Send a GET, following redirects; the response of the last hop and the commit any hop named."""
        url, commit = self.url, None
        origin = urlsplit(self.url).netloc
        for _ in range(_REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https"):
                raise RemoteReadError(f"{self.name}: redirected to a {parts.scheme or 'relative'} URL", path=self.name)
            sent = headers if parts.netloc == origin else {k: v for k, v in headers.items()
                                                           if k.lower() != "authorization"}
            conn = self._connection(parts.scheme, parts.netloc)
            target = parts.path or "/"
            if parts.query:
                target += "?" + parts.query
            try:
                conn.request("GET", target, headers=sent)
                response = conn.getresponse()
            except BaseException:
                self._drop(parts.scheme, parts.netloc)
                raise
            commit = commit or response.getheader("X-Repo-Commit")
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                response.read()  # small; keeps the connection usable
                url = urljoin(url, response.getheader("Location") or "")
                continue
            return response, commit
        raise RemoteReadError(f"{self.name}: more than {_REDIRECTS} redirects", path=self.name)

    def _connection(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        conns: dict[tuple[str, str], http.client.HTTPConnection] = getattr(self._local, "conns", None) or {}
        self._local.conns = conns
        conn = conns.get((scheme, netloc))
        if conn is None:
            kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = kind(netloc, timeout=self._policy.timeout)
            conns[(scheme, netloc)] = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _drop(self, scheme: str, netloc: str) -> None:
        conn = getattr(self._local, "conns", {}).pop((scheme, netloc), None)
        if conn is not None:
            conn.close()

    def _pin(self, response: http.client.HTTPResponse, commit: str | None, first: bool) -> None:
        identity = response.getheader("ETag") or response.getheader("Last-Modified")
        with self._lock:
            if first and self.identity is None and self.size is None:
                self.identity, self.commit = identity, commit
                return
        if identity != self.identity:
            raise self._changed(f"its ETag went from {self.identity} to {identity}")
        if commit is not None and self.commit is not None and commit != self.commit:
            raise self._changed(f"its commit went from {self.commit} to {commit}")

    def _changed(self, what: str) -> RemoteChangedError:
        return RemoteChangedError(f"{self.name}: the remote file changed while it was read ({what}); "
                                  "nothing read from it is used, score it again", path=self.name)

    def read_all(self, limit: int) -> bytes:
        """The whole file, when it has at most ``limit`` bytes (a shard index, a config): one range
        read of ``limit`` bytes, pinned like any other.

        Raises:
            RemoteReadError: larger than ``limit``, or as a range read raises.
        """
        data = self.head(limit + 1)
        if len(data) > limit:
            raise RemoteReadError(f"{self.name}: larger than {limit} bytes", path=self.name)
        return data


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _retry_after(text: str | None) -> float | None:
    """``Retry-After`` in seconds (an HTTP date is not honoured: the back-off is used)."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _shown(response: Any, header: str) -> str:
    value = response.getheader(header)
    return "none" if value is None else repr(value[:80])
