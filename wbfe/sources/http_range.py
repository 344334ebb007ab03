"""HTTP range reads of one remote file, pinned to the version first seen, each answer checked before a byte of it
is used, with bounded retries, through huggingface_hub's HTTP client (docs/remote.md)."""

from __future__ import annotations

import functools
import os
import re
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from wbfe.errors import (MissingDependencyError, RangeNotSupportedError, RemoteChangedError, RemoteReadError,
                         TruncatedCheckpointError, WbfeError)
from wbfe.sources.ranged import RangedFile

__all__ = ["RetryPolicy", "RemoteFile", "DEFAULT_POLICY", "FIRST_READ", "DOWNLOAD", "http_package", "changed", "said"]

# The first request of a file asks for this many bytes: most safetensors headers fit, so a header costs one request.
FIRST_READ = 1 << 16
_REDIRECTS = 5
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.I)
# The advice of a refused stream: true with --stream and where wbfe chose to stream (a tensor's read may meet it).
DOWNLOAD = "score it with --no-stream (stream=False) to download it first"
_HTTP_NAMES = ("Client", "Timeout", "TransportError", "TooManyRedirects", "UnsupportedProtocol", "InvalidURL")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard a range read tries.

    Attributes:
        attempts: tries per request (the first included).
        backoff: the wait before the first retry, in seconds; doubled before each next one, up to ``backoff_max``.
        retry_after_max: the longest ``Retry-After`` obeyed.
        timeout: seconds a connection, or one socket read, may wait.
        min_rate: bytes per second under which a body is cut and retried, on top of ``timeout`` seconds of grace.
    """

    attempts: int = 6
    backoff: float = 0.5
    backoff_max: float = 20.0
    retry_after_max: float = 60.0
    timeout: float = 30.0
    min_rate: float = 50_000.0

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first), or the server's ``Retry-After``."""
        if retry_after is not None:
            return max(0.0, min(retry_after, self.retry_after_max))
        return min(self.backoff * (2 ** retry), self.backoff_max)


DEFAULT_POLICY = RetryPolicy()


@functools.cache
def http_package() -> Any:
    """The package of huggingface_hub's HTTP session (``httpx2``; ``httpx`` in huggingface_hub 1.x), or a
    ``MissingDependencyError`` where it is requests' (huggingface_hub < 1.0)."""
    from huggingface_hub import get_session

    for cls in type(get_session()).__mro__:  # a client factory's own subclass included
        package = sys.modules.get(cls.__module__.split(".")[0])
        if package is not None and all(hasattr(package, n) for n in _HTTP_NAMES):
            return package
    raise MissingDependencyError("remote reads need huggingface_hub 1.0 or later (its session is not an httpx "
                                 "client): pip install -U huggingface_hub")


class _Retry(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class RemoteFile(RangedFile):
    """Byte ranges of one remote file (a :class:`~wbfe.sources.ranged.RangedFile`), read by any thread.

    Args:
        headers: sent with every request to the URL's own host (``Authorization`` is dropped on a redirect).
        sleep: the wait between tries (tests record it instead).
        hub: a hub file, read through huggingface_hub's session (its client factory, its offline mode).
    """

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None, policy: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep, hub: bool = False):
        self.url = self.name = url
        self._headers = dict(headers or {})
        self._policy = policy or DEFAULT_POLICY
        self._sleep = sleep
        self._lock = threading.Lock()  # pinning and the counters
        self._hub = hub
        self._own: Any = None  # this file's client (not the hub's shared one)

    def head(self, nbytes: int = FIRST_READ) -> bytes:
        out = bytearray(nbytes)
        got = self._fetch(0, nbytes, memoryview(out), first=True)
        if self.identity is None and (self.size or 0) > got:  # more reads to come, none of them checkable
            raise RangeNotSupportedError.at(
                self.name, "the server sends neither ETag nor Last-Modified, so a file swapped for another of the "
                "same size between two range reads would go unseen; " + DOWNLOAD)
        return bytes(out[:got])

    def read_into(self, start: int, into: memoryview) -> None:
        if len(into):
            self._fetch(start, len(into), into)

    def close(self) -> None:
        """Close this file's own client (huggingface_hub's session is shared: it stays)."""
        with self._lock:
            own, self._own = self._own, None
        if own is not None:
            own.close()

    def _client(self) -> Any:
        if self._hub:
            from huggingface_hub import get_session

            return get_session()
        with self._lock:
            if self._own is None:
                # The environment as it is now: proxies, NO_PROXY, SSL_CERT_FILE (trust_env).
                self._own = http_package().Client(trust_env=True, verify=_ca_bundle(), follow_redirects=True,
                                                  max_redirects=_REDIRECTS)
            return self._own

    def _fetch(self, start: int, nbytes: int, into: memoryview, *, first: bool = False) -> int:
        policy = self._policy
        http = http_package()
        last = ""
        for attempt in range(policy.attempts):
            try:
                return self._attempt(start, nbytes, into, first)
            except _Retry as exc:
                last, retry_after = str(exc), exc.retry_after
            except WbfeError:  # a verdict (404, a changed file), some of them OSErrors too: never retried
                raise
            except (http.TooManyRedirects, http.UnsupportedProtocol, http.InvalidURL) as exc:
                raise RemoteReadError.at(self.name, said(exc)) from None
            except http.TransportError as exc:  # refused, reset, timed out, cut short, a proxy's failure
                if _certificate_refused(exc):
                    raise RemoteReadError.at(
                        self.name, f"the server's TLS certificate is not trusted ({said(exc)}); point "
                        "SSL_CERT_FILE at the CA bundle that signs it") from None
                last, retry_after = said(exc), None
            except OSError as exc:  # huggingface_hub's offline mode (a ConnectionError): no retry
                raise RemoteReadError.at(self.name, said(exc)) from None
            if attempt + 1 < policy.attempts:
                self._sleep(policy.delay(attempt, retry_after))
        raise RemoteReadError.at(self.name, f"bytes {start}-{start + nbytes - 1} could not be read in "
                                 f"{policy.attempts} tries (last: {last})")

    def _attempt(self, start: int, nbytes: int, into: memoryview, first: bool) -> int:
        began = time.monotonic()
        headers = {**self._headers, "Range": f"bytes={start}-{start + nbytes - 1}", "Accept-Encoding": "identity"}
        if self.identity is not None and self.identity.startswith('"'):  # a strong ETag (a weak one starts W/)
            headers["If-Match"] = self.identity
        with self._client().stream("GET", self.url, headers=headers, follow_redirects=True,
                                   timeout=http_package().Timeout(self._policy.timeout)) as response:
            with self._lock:
                self.requests += 1
            return self._answer(response, start, nbytes, into, first, began)

    def _answer(self, response: Any, start: int, nbytes: int, into: memoryview, first: bool, began: float) -> int:
        status = response.status_code
        if status in (404, 410):
            raise RemoteReadError.at(self.name, f"not found (HTTP {status})")
        if status in (401, 403) and not self._hub:  # HF_TOKEN would change nothing: a URL is sent no credentials
            sent = ("the URL's query was sent with it (a signature may have expired, or sign one file, not the "
                    "shards beside it)" if "?" in self.url else "wbfe sends no credentials with a URL")
            raise RemoteReadError.at(self.name, f"access refused (HTTP {status}); {sent}: name a hub model as "
                                     "org/name (HF_TOKEN is sent), a bucket as s3://... or gs://... (the store's "
                                     "credentials are used)")
        if status in (401, 403):
            gated = response.headers.get("X-Error-Code") == "GatedRepo"
            raise RemoteReadError.at(self.name, f"access refused (HTTP {status}); "
                + ("a gated model: accept its terms on the hub, then " if gated else "a token with access is needed: ")
                + "set HF_TOKEN (or run hf auth login) for the Hugging Face hub")
        if status == 412:
            raise changed(self.name, "its ETag no longer matches (HTTP 412)")
        if status == 416:
            if self.size is not None:
                raise changed(self.name, f"it no longer holds bytes {start}-{start + nbytes - 1} (HTTP 416)")
            raise TruncatedCheckpointError.at(self.name, "empty file (HTTP 416)")
        if status == 429 or 500 <= status < 600:
            raise _Retry(f"HTTP {status}", _number(response.headers.get("Retry-After"), float))
        if status not in (200, 206):
            raise RemoteReadError.at(self.name, f"the server answered HTTP {status}")
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):  # not the file's bytes, and a retry would get the same
            raise RangeNotSupportedError.at(
                self.name, f"the server compressed the range asked for (Content-Encoding: {encoding[:40]}) although "
                "asked not to, so it cannot be streamed; " + DOWNLOAD)
        # The commit any hop named (the hub's resolve route answers with a redirect to its storage).
        commit = next((r.headers["X-Repo-Commit"] for r in (*response.history, response)
                       if "X-Repo-Commit" in r.headers), None)
        self._pin(response, commit, first)
        length = _number(response.headers.get("Content-Length"))
        if status == 200:
            # The whole file: use it only where the whole file is what was asked for (a small file's
            # first read); never pull a whole checkpoint through a request for one tensor.
            if start != 0 or length is None or length > nbytes:
                raise RangeNotSupportedError.at(
                    self.name, "the server ignores HTTP range requests (it answered 200 with the whole file), "
                    "so it cannot be streamed; " + DOWNLOAD)
            total, expected = length, length
        else:
            given = response.headers.get("Content-Range")
            match = _CONTENT_RANGE.match(given or "")
            if match is None or match.group(3) == "*":
                shown = "none" if given is None else repr(given[:80])
                raise _Retry(f"a 206 answer without a valid Content-Range ({shown})")
            first_byte, last_byte, total = int(match.group(1)), int(match.group(2)), int(match.group(3))
            if self.size is not None and total != self.size:
                raise changed(self.name, f"its size went from {self.size} to {total} bytes")
            expected = min(nbytes, total - start)
            if first_byte != start or last_byte != start + expected - 1 or expected <= 0:
                raise _Retry(f"asked for bytes {start}-{start + nbytes - 1}, the answer holds "
                             f"{first_byte}-{last_byte}/{total}")
            if length is not None and length != expected:
                raise _Retry(f"a Content-Length of {length} for {expected} bytes")
            if not first and expected != nbytes:
                raise changed(self.name, f"it ends before byte {start + nbytes}")
        with self._lock:
            if self.size is None:
                self.size = total
        deadline = began + self._policy.timeout + expected / self._policy.min_rate
        got = 0
        # iter_raw without a chunk size: what each socket read brings, so that a trickle that keeps
        # each read under the timeout still meets the deadline.
        try:
            for chunk in response.iter_raw():
                n = len(chunk)
                if got + n > expected:
                    raise _Retry(f"a body longer than the {expected} bytes asked for")
                into[got:got + n] = chunk
                got += n
                with self._lock:
                    self.bytes_fetched += n
                if time.monotonic() > deadline and got < expected:
                    raise _Retry(f"too slow: {got} of {expected} bytes in {time.monotonic() - began:.1f} s")
        except http_package().TransportError as exc:  # cut, reset or timed out within the body
            raise _Retry(f"short read: {got} of {expected} bytes ({said(exc)})") from None
        if got < expected:
            raise _Retry(f"short read: {got} of {expected} bytes")
        return got

    def _pin(self, response: Any, commit: str | None, first: bool) -> None:
        identity = response.headers.get("ETag") or response.headers.get("Last-Modified")
        with self._lock:
            if first and self.identity is None and self.size is None:
                self.identity, self.commit = identity, commit
                return
        if identity != self.identity:
            raise changed(self.name, f"its ETag went from {self.identity} to {identity}")
        if commit is not None and self.commit is not None and commit != self.commit:
            raise changed(self.name, f"its commit went from {self.commit} to {commit}")

    def read_all(self, limit: int) -> bytes:
        """The whole file, when it has at most ``limit`` bytes, in one pinned range read."""
        out = bytearray(limit + 1)
        got = self._fetch(0, limit + 1, memoryview(out), first=True)  # one read: nothing to pin it against
        if got > limit:
            raise RemoteReadError.at(self.name, f"larger than {limit} bytes")
        return bytes(out[:got])


def _number(text: str | None, kind: type = int) -> Any:
    """``kind(text)``, else None (a ``Retry-After`` HTTP date is not honoured: the back-off is used)."""
    try:
        return kind(text) if text is not None else None
    except ValueError:
        return None


def changed(name: str, what: str) -> RemoteChangedError:
    """The error for a remote file (HTTP or object store) that changed while it was read."""
    return RemoteChangedError.at(name, f"the remote file changed while it was read ({what}); "
                                 "nothing read from it is used, score it again")


def said(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())[:limit]
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def _certificate_refused(exc: BaseException | None) -> bool:
    for _ in range(5):  # the TLS error sits a cause or two below the client's own
        if exc is None or isinstance(exc, ssl.SSLCertVerificationError):
            return exc is not None
        exc = exc.__cause__ or exc.__context__
    return False


def _ca_bundle() -> Any:
    """What a URL's own client trusts: ``SSL_CERT_FILE``/``SSL_CERT_DIR`` (read by the client), else
    ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` (set behind a TLS-inspecting proxy), else the system's."""
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if not bundle or os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR"):
        return True
    try:
        return ssl.create_default_context(cafile=bundle)
    except (OSError, ssl.SSLError) as exc:
        raise RemoteReadError(f"the CA bundle {bundle} (REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE) cannot be read: "
                              f"{exc}", path=bundle) from None
