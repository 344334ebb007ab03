"""On-disk cache of per-model scores, keyed by checkpoint content hash and scoring options; every file is
checksummed, a corrupt one removed and recomputed, never served (docs/ranking.md, docs/cache.md)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar, Union

from wbfe._config import user_path
from wbfe.errors import InvalidOptionError
from wbfe.ranking.claims import CLAIM_SUFFIX, STALE_AFTER, Claim, try_claim
from wbfe.render.files import json_sha256, write_atomic
from wbfe.render.text import json_ready

__all__ = ["ScoreCache", "cache_key", "score_claimed", "CACHE_FORMAT"]

_T = TypeVar("_T")

CACHE_FORMAT = "wbfe-score-cache/2"
_INDEX_FORMAT = "wbfe-hash-index/2"
_MAX_ENTRY_BYTES = 16 * 2**20  # a summary is a few KB; anything this large is not one of ours


def _checksum(obj: Any) -> str:
    # Non-finite numbers are null (json_ready), as in every file wbfe writes.
    return json_sha256(json_ready(obj))


def cache_key(content_hash: str, options: Mapping[str, Any]) -> str:
    """The entry name for a checkpoint's content hash scored with ``options`` (hex SHA-256)."""
    return _checksum({"content": content_hash, "options": dict(options)})


def _file_signature(ref: str) -> Optional[list[list[Any]]]:
    """(relative path, size, mtime_ns, ctime_ns, inode, device) of a local file or of every file under a folder;
    None for anything that is not a local path."""
    path = Path(ref)
    with contextlib.suppress(OSError):
        if path.is_file():
            return [[path.name, *_stat_signature(path)]]
        if path.is_dir():
            return [[str(child.relative_to(path)), *_stat_signature(child)]
                    for child in sorted(p for p in path.rglob("*") if p.is_file())]
    return None


def _stat_signature(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def clear_path(path: Path) -> None:
    """Remove whatever is at ``path`` (a file, a link, or a folder someone put there), never following a link."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class ScoreCache:
    """A folder of score entries (created on first write); ``corrupted``: keys found corrupt (and removed) so far."""

    def __init__(self, directory: Union[str, Path]) -> None:
        if not os.fspath(directory).strip():
            raise InvalidOptionError("the score cache folder is empty ('')")
        self.directory = user_path(directory)
        self.corrupted: list[str] = []

    def _entry_path(self, key: str) -> Path:
        return self.directory / "entries" / key[:2] / f"{key}.json"

    def check_writable(self) -> None:
        """Make sure entries can be stored here (before a ranking scores its first model).

        Raises:
            InvalidOptionError: the folder cannot be created or written.
        """
        probe = self.directory / f".probe.{secrets.token_hex(6)}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise InvalidOptionError(f"the score cache {self.directory} is not writable ({exc.strerror or exc}); "
                                     "choose another with --cache-dir or rank without one (--no-cache)",
                                     path=str(self.directory)) from None

    def _read(self, path: Path, fmt: str, key: str) -> Optional[dict[str, Any]]:
        """The payload of the cache file at ``path``; None when absent, or corrupt (then removed)."""
        try:
            st = path.lstat()
        except FileNotFoundError:
            return None
        try:
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_ENTRY_BYTES:
                raise ValueError("not a regular file, or too large")
            with open(path, "rb") as handle:
                entry = json.loads(handle.read(_MAX_ENTRY_BYTES + 1).decode("utf-8"))
            if not (isinstance(entry, dict) and entry.get("format") == fmt and entry.get("key") == key
                    and isinstance(entry.get("payload"), dict)
                    and entry.get("checksum") == _checksum(entry["payload"])):
                raise ValueError("checksum, key or format mismatch")
            return dict(entry["payload"])
        except (OSError, ValueError, TypeError, RecursionError):  # RecursionError: JSON nested too deeply
            self.corrupted.append(key)
            clear_path(path)
            return None

    def _write(self, path: Path, fmt: str, key: str, payload: Mapping[str, Any]) -> Path:
        body = json_ready(dict(payload))
        entry = {"format": fmt, "key": key, "checksum": _checksum(body), "payload": body}
        if path.is_symlink() or path.is_dir():
            clear_path(path)
        write_atomic(path, json.dumps(entry, sort_keys=True, allow_nan=False))
        return path

    def get(self, key: str) -> Optional[dict[str, Any]]:
        """The payload stored under ``key``; None when absent or corrupt (then removed). A hit sets the entry's
        modification time to now: the cache's least-recently-used order."""
        path = self._entry_path(key)
        payload = self._read(path, CACHE_FORMAT, key)
        if payload is not None:
            with contextlib.suppress(OSError):  # a read-only cache still serves its entries
                os.utime(path, follow_symlinks=False)
        return payload

    def claim_path(self, key: str) -> Path:
        """The claim (lock) file of entry ``key``, beside the entry."""
        return self._entry_path(key).with_name(f"{key}{CLAIM_SUFFIX}")

    def claim(self, key: str, *, stale_after: float = STALE_AFTER) -> Optional[Claim]:
        """Claim entry ``key`` for scoring: a :class:`~wbfe.ranking.claims.Claim` to release once the entry is
        stored (or the work failed); None when a live process holds it (a stale claim is taken over)."""
        return try_claim(self.claim_path(key), stale_after=stale_after)

    def put(self, key: str, payload: Mapping[str, Any]) -> Path:
        """Store ``payload`` (JSON-serialisable; non-finite numbers become null) under ``key``
        atomically; returns the entry file."""
        return self._write(self._entry_path(key), CACHE_FORMAT, key, payload)

    def content_hash(self, ref: str, compute: Callable[[str], str]) -> str:
        """``compute(ref)`` (e.g. :func:`wbfe.sources.content_hash`), remembered for local files while their size,
        mtime, ctime and inode are unchanged."""
        signature = _file_signature(ref)
        if signature is None:
            return compute(ref)
        key = hashlib.sha256(str(Path(ref).resolve()).encode("utf-8")).hexdigest()
        index = self.directory / "hashes" / f"{key}.json"
        saved = self._read(index, _INDEX_FORMAT, key)
        if saved is not None and saved.get("signature") == signature and isinstance(saved.get("sha256"), str):
            return str(saved["sha256"])
        digest = compute(ref)
        self._write(index, _INDEX_FORMAT, key, {"ref": ref, "signature": signature, "sha256": digest})
        return digest


def score_claimed(cache: ScoreCache, items: Sequence[_T], *, key_of: Callable[[_T], Optional[str]],
                  score: Callable[[_T], None], shared: Callable[[_T, dict[str, Any]], None],
                  poll: float = 0.5, stale_after: float = STALE_AFTER) -> None:
    """Score each item at most once among the processes sharing ``cache`` (docs/cache.md): one another process
    holds is taken from the cache once stored (``shared(item, payload)``), or scored here if its owner gives it up.

    Args:
        key_of: an item's entry key; None scores it without claiming.
        score: scores one item and stores its entry (``cache.put``) before returning, or records its failure.
        poll: seconds between looks at the entries other processes hold.
    """
    waiting = list(items)
    first = True
    while waiting:
        deferred = []
        for item in waiting:
            key = key_of(item)
            if key is None:
                score(item)
            elif (hit := None if first else cache.get(key)) is not None:
                shared(item, hit)
            elif (claim := cache.claim(key, stale_after=stale_after)) is None:
                deferred.append(item)
            else:
                with claim:
                    if (hit := cache.get(key)) is not None:  # stored by another driver since this one looked it up
                        shared(item, hit)
                    else:
                        score(item)
        waiting, first = deferred, False
        if waiting:
            time.sleep(poll)
