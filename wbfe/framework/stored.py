"""Framework descriptions remembered on disk (docs/cache.md, kind ``descriptions``), so that a second
score of an architecture imports neither torch nor its framework. The key hashes all the build
depends on (what it read, the framework's and torch's versions, wbfe's code): an upgrade is a miss,
never a stale answer. A cache that cannot be written costs only the speed."""

from __future__ import annotations

import functools
import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from wbfe._config import wbfe_cache_dir
from wbfe._provenance import tree_digest
from wbfe.errors import WbfeError
from wbfe.framework.description import Fallback, FrameworkDescription
from wbfe.render.files import json_sha256, write_atomic

__all__ = ["FORMAT", "MAX_FILES", "description_key", "recall", "remember", "cached"]

FORMAT = "wbfe-description-cache/1"
MAX_FILES = 2000  # a description is a few KB (an LLM's is ~100 KB): at most ~200 MB, usually far less
_MAX_BYTES = 64 * 2**20  # larger than any description: not one of ours

Described = Union[FrameworkDescription, Fallback]
_digest = functools.partial(json_sha256, default=str)


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    # the parent package is imported before any of its modules: its version, without importing it here
    version = getattr(sys.modules.get("wbfe"), "__version__", "unknown")
    return f"{version}+{tree_digest(Path(__file__).resolve().parent)}"


def description_key(framework: str, packages: tuple[str, ...], read: Mapping[str, Any]) -> Optional[str]:
    """The key (hex SHA-256) of the description ``framework`` builds from ``read`` (JSON data) with
    ``packages`` at their installed versions; None where one is not installed or ``read`` is not JSON."""
    try:
        versions = {name: metadata.version(name) for name in packages}
        return _digest({"format": FORMAT, "framework": framework, "versions": versions, "wbfe": _code_digest(),
                        "read": read})
    except (metadata.PackageNotFoundError, TypeError, ValueError):
        return None


def cached(framework: str, packages: tuple[str, ...], read: Mapping[str, Any], build: Callable[[], Described]
           ) -> Described:
    """The description remembered for ``read``, else ``build()``'s, remembered unless it says ``framework`` is not
    installed (see :func:`description_key`)."""
    key = description_key(framework, packages, read)
    if (found := recall(key)) is None:
        found = build()
        if not (isinstance(found, Fallback) and found.startswith(f"{framework} is not installed")):
            remember(key, found)
    return found


def _path(key: str) -> Path:
    return wbfe_cache_dir() / "descriptions" / key[:2] / f"{key}.json"


def recall(key: Optional[str]) -> Optional[Described]:
    """The description remembered under ``key``; None where there is none or its file does not check out."""
    if key is None:
        return None
    path = _path(key)
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > _MAX_BYTES:
            return None
        stored = json.loads(path.read_text(encoding="utf-8"))
        payload = stored["payload"]
        if stored.get("format") != FORMAT or stored.get("key") != key or stored.get("sha256") != _digest(payload):
            return None
        found: Described = (Fallback(payload["fallback"]) if "fallback" in payload
                            else FrameworkDescription.from_dict(payload["description"]))
        os.utime(path)  # a hit is a use: pruning removes the least recently used first
    except (OSError, ValueError, TypeError, LookupError, AttributeError, RecursionError, WbfeError):
        return None  # not one of ours, or damaged: built again and rewritten
    return found


def remember(key: Optional[str], found: Described) -> None:
    """Write ``found`` under ``key`` (nothing for a None key); a cache that cannot be written is passed over."""
    if key is None:
        return
    payload: dict[str, Any] = ({"fallback": str(found)} if isinstance(found, Fallback)
                               else {"description": found.to_dict()})
    path = _path(key)
    try:
        write_atomic(path, json.dumps({"format": FORMAT, "key": key, "sha256": _digest(payload), "payload": payload},
                                      allow_nan=False))
    except (TypeError, ValueError):  # facts that are not JSON: not remembered, built again next time
        return
    except (OSError, WbfeError):  # a read-only or full cache: the description is used all the same
        return
    _bound(path.parent.parent, keep=path)


def _bound(root: Path, *, keep: Path) -> None:
    """Remove the least recently used description files beyond :data:`MAX_FILES` (never ``keep``)."""
    try:
        files = [p for shard in root.iterdir() if shard.is_dir() and not shard.is_symlink()
                 for p in shard.glob("*.json") if p.is_file() and not p.is_symlink()]
        if len(files) <= MAX_FILES:
            return
        used = {p: max(p.stat().st_atime, p.stat().st_mtime) for p in files}
    except OSError:
        return
    for path in sorted(files, key=used.__getitem__)[: len(files) - MAX_FILES]:
        if path != keep:
            path.unlink(missing_ok=True)
