"""On-disk cache of per-model scores, keyed by checkpoint content hash and scoring options.

One JSON file per entry, written atomically (temporary file in the same folder, fsync, rename), so
an interrupted run leaves either a complete entry or none, and the next run resumes from there.
Each entry carries a SHA-256 checksum of its payload: a truncated or edited file is detected,
removed and recomputed instead of being trusted.

A second, tiny index maps a *local* reference to its content hash while the files' sizes and
modification times are unchanged, so a re-run does not re-read every checkpoint to hash it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from wbfe.report import write_atomic

__all__ = ["ScoreCache", "default_cache_dir", "cache_key", "CACHE_FORMAT"]

CACHE_FORMAT = "wbfe-score-cache/1"


def default_cache_dir() -> Path:
    """``$WBFE_CACHE_DIR``, else ``$XDG_CACHE_HOME/wbfe/scores``, else ``~/.cache/wbfe/scores``."""
    from wbfe._config import wbfe_cache_dir

    return wbfe_cache_dir()


def _canonical(obj: Any) -> str:
    # NaN is allowed inside the cache (summaries hold NaN for failed fits); key order is fixed.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cache_key(content_hash: str, options: Mapping[str, Any]) -> str:
    """The entry name for a checkpoint's content hash scored with ``options`` (hex SHA-256)."""
    return _sha256(_canonical({"content": content_hash, "options": dict(options)}))


def _file_signature(ref: str) -> Optional[list[list[Any]]]:
    """(relative path, size, mtime_ns) of a local file or of every file under a folder; None otherwise."""
    path = Path(ref)
    try:
        if path.is_file():
            st = path.stat()
            return [[path.name, st.st_size, st.st_mtime_ns]]
        if path.is_dir():
            out = []
            for child in sorted(p for p in path.rglob("*") if p.is_file()):
                st = child.stat()
                out.append([str(child.relative_to(path)), st.st_size, st.st_mtime_ns])
            return out
    except OSError:
        return None
    return None


class ScoreCache:
    """A folder of score entries.

    Args:
        directory: where entries live (created on first write).

    Attributes:
        corrupted: keys of entries found corrupt (and removed) since this object was made.
    """

    def __init__(self, directory: Union[str, Path]) -> None:
        self.directory = Path(directory).expanduser()
        self.corrupted: list[str] = []

    def _entry_path(self, key: str) -> Path:
        return self.directory / "entries" / key[:2] / f"{key}.json"

    def get(self, key: str) -> Optional[dict[str, Any]]:
        """The payload stored under ``key``; None when absent or corrupt (a corrupt file is removed)."""
        path = self._entry_path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            entry = json.loads(text)
            ok = (
                isinstance(entry, dict)
                and entry.get("format") == CACHE_FORMAT
                and entry.get("key") == key
                and isinstance(entry.get("payload"), dict)
                and entry.get("checksum") == _sha256(_canonical(entry["payload"]))
            )
        except (ValueError, TypeError):
            ok = False
        if not ok:
            self.corrupted.append(key)
            path.unlink(missing_ok=True)
            return None
        return entry["payload"]

    def put(self, key: str, payload: Mapping[str, Any]) -> Path:
        """Store ``payload`` (JSON-serialisable) under ``key`` atomically; returns the entry file."""
        body = dict(payload)
        entry = {"format": CACHE_FORMAT, "key": key, "checksum": _sha256(_canonical(body)), "payload": body}
        path = self._entry_path(key)
        write_atomic(path, json.dumps(entry, sort_keys=True, allow_nan=True))
        return path

    def content_hash(self, ref: str, compute: Callable[[str], str]) -> str:
        """``compute(ref)``, remembered for local files while their size and mtime are unchanged.

        Args:
            ref: the checkpoint reference.
            compute: the real hash function (e.g. :func:`wbfe.sources.content_hash`).
        """
        signature = _file_signature(ref)
        if signature is None:
            return compute(ref)
        index = self.directory / "hashes" / f"{_sha256(str(Path(ref).resolve()))}.json"
        try:
            saved = json.loads(index.read_text(encoding="utf-8"))
            if saved.get("signature") == signature and isinstance(saved.get("sha256"), str):
                return str(saved["sha256"])
        except (OSError, ValueError, AttributeError):
            pass
        digest = compute(ref)
        write_atomic(index, json.dumps({"ref": ref, "signature": signature, "sha256": digest}))
        return digest
