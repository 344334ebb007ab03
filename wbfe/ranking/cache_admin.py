"""What wbfe's cache folder holds, and pruning it: by age, and to a size bound, least recently used first.

The folder's layout and the pruning rules are in docs/cache.md. Only wbfe's own shapes are removed, nothing is
followed through a symbolic link, and every removal is checked to lie inside the cache folder.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from wbfe._config import user_path, wbfe_cache_dir
from wbfe.errors import InvalidOptionError, printable
from wbfe.ranking.cache import clear_path
from wbfe.ranking.claims import is_stale, read_claim
from wbfe.sources.object_bound import DEFAULT_MAX_SIZE, format_size, parse_size, tree_usage

__all__ = ["CacheUnit", "CacheInfo", "PruneReport", "cache_info", "prune_cache", "parse_size", "format_size",
           "DEFAULT_MAX_SIZE", "KINDS"]

KINDS = ("entries", "hashes", "descriptions", "objects", "claims", "partial")
_PARTIAL_AGE = 86400.0
_HEX64 = r"[0-9a-f]{64}"
_ENTRY = re.compile(rf"^{_HEX64}\.json$")
_CLAIM = re.compile(rf"^{_HEX64}\.claim$")
_TEMP = re.compile(rf"^\.{_HEX64}\.(json\.[0-9a-f]+\.tmp|claim\.[0-9a-f]+\.stale)$")  # write_atomic, claims
_OBJECT = re.compile(rf"^{_HEX64}$")
_OBJECT_PART = re.compile(rf"^\.{_HEX64}\.[0-9a-f]+\.part$")
_SHARD = re.compile(r"^[0-9a-f]{2}$")


@dataclass(frozen=True)
class CacheUnit:
    """One removable thing of a kind of :data:`KINDS`: its bytes (a folder: its files, links not followed) and last
    use (seconds since the epoch: the latest access or modification of its files)."""

    kind: str
    path: Path
    size: int
    last_used: float


def _dirs(path: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            yield from sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return


def _file_unit(kind: str, entry: os.DirEntry[str]) -> CacheUnit:
    st = entry.stat(follow_symlinks=False)
    return CacheUnit(kind, Path(entry.path), st.st_size, max(st.st_atime, st.st_mtime))


def _scan(root: Path) -> tuple[list[CacheUnit], int, int]:
    """(units, bytes of other files, count of symbolic links skipped) under ``root``."""
    units: list[CacheUnit] = []
    foreign: list[os.DirEntry[str]] = []  # not wbfe's shapes (a symbolic link is never a folder here)
    for top in _dirs(root):
        if top.name not in ("entries", "hashes", "descriptions", "objects") or not top.is_dir(follow_symlinks=False):
            foreign.append(top)
            continue
        for shard in [top] if top.name == "hashes" else _dirs(Path(top.path)):
            if not shard.is_dir(follow_symlinks=False) or (top.name != "hashes" and not _SHARD.match(shard.name)):
                foreign.append(shard)
                continue
            for item in _dirs(Path(shard.path)):
                if (unit := _classify(top.name, item)) is None:
                    foreign.append(item)
                else:
                    units.append(unit)
    other = sum(tree_usage(Path(e.path))[0] if e.is_dir(follow_symlinks=False)
                else e.stat(follow_symlinks=False).st_size for e in foreign if not e.is_symlink())
    return units, other, sum(1 for e in foreign if e.is_symlink())


def _classify(top: str, item: os.DirEntry[str]) -> Optional[CacheUnit]:
    if item.is_symlink():
        return None
    is_dir = item.is_dir(follow_symlinks=False)
    if top in ("entries", "hashes", "descriptions") and not is_dir:
        if _ENTRY.match(item.name):
            return _file_unit(top, item)
        if top == "entries" and _CLAIM.match(item.name):
            return _file_unit("claims", item)
        if _TEMP.match(item.name):
            return _file_unit("partial", item)
    if top == "objects" and is_dir and (_OBJECT.match(item.name) or _OBJECT_PART.match(item.name)):
        return CacheUnit("objects" if _OBJECT.match(item.name) else "partial", Path(item.path),
                         *tree_usage(Path(item.path)))
    return None


@dataclass(frozen=True)
class CacheInfo:
    """What a cache folder holds: every removable unit, the bytes of files wbfe did not write and the symbolic links
    seen (neither ever removed). ``exists`` is False for a folder that is not there; ``default`` says it is wbfe's
    own folder (then it is merely not created yet), not one the caller named."""

    directory: Path
    units: tuple[CacheUnit, ...]
    other_bytes: int
    links: int
    exists: bool = True
    default: bool = False

    @property
    def total(self) -> int:
        """Bytes of the removable units."""
        return sum(u.size for u in self.units)

    def by_kind(self) -> dict[str, dict[str, Any]]:
        """Per kind: count, bytes, oldest and newest last use (None for an empty kind)."""
        mine = {kind: [u for u in self.units if u.kind == kind] for kind in KINDS}
        return {kind: {"count": len(units), "bytes": sum(u.size for u in units),
                       "oldest_use": min((u.last_used for u in units), default=None),
                       "newest_use": max((u.last_used for u in units), default=None)} for kind, units in mine.items()}

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape."""
        return {"directory": str(self.directory), "exists": self.exists, "total_bytes": self.total,
                "kinds": self.by_kind(), "other_bytes": self.other_bytes, "links_skipped": self.links,
                "default_max_bytes": DEFAULT_MAX_SIZE}

    def table(self) -> str:
        """A text summary, one line per kind."""
        now = time.time()
        lines = [f"cache: {printable(str(self.directory))}"]
        if not self.exists:
            lines.append("  not created yet (wbfe creates it on first use)" if self.default
                         else "  note: this folder does not exist")
        for kind, row in self.by_kind().items():
            ages = "" if row["oldest_use"] is None else (
                f", last used {(now - row['newest_use']) / 86400:.1f}-{(now - row['oldest_use']) / 86400:.1f} days ago")
            lines.append(f"  {kind:12s} {row['count']:6d}  {format_size(row['bytes']):>10s}{ages}")
        lines.append(f"  {'total':21s}{format_size(self.total):>10s}  (prune bound by default: "
                     f"{format_size(DEFAULT_MAX_SIZE)})")
        if self.other_bytes or self.links:
            lines.append(f"  not wbfe's: {format_size(self.other_bytes)} of other files, {self.links} symbolic "
                         "link(s): never removed")
        return "\n".join(lines) + "\n"


def cache_info(directory: Union[str, Path, None] = None) -> CacheInfo:
    """Scan a cache folder (default: wbfe's cache folder, docs/cache.md).

    Raises:
        InvalidOptionError: the path exists and is not a folder.
    """
    default = directory is None
    directory = wbfe_cache_dir() if directory is None else directory
    if not os.fspath(directory).strip():
        raise InvalidOptionError("the cache folder is empty ('')")
    root = user_path(directory)
    is_dir = os.path.isdir(root)  # False, not an OSError, for a name too long for the file system
    if os.path.exists(root) and not is_dir:
        raise InvalidOptionError(f"not a folder: {root}", path=str(root))
    units, other, links = _scan(root) if is_dir else ([], 0, 0)
    return CacheInfo(root, tuple(units), other, links, exists=is_dir, default=default)


@dataclass
class PruneReport:
    """What :func:`prune_cache` removed (oldest use first; with ``dry_run``: would remove) under the bounds applied."""

    directory: Path
    removed: list[CacheUnit] = field(default_factory=list)
    kept_bytes: int = 0
    max_size: Optional[int] = None
    older_than_days: Optional[float] = None
    dry_run: bool = False
    exists: bool = True

    @property
    def freed(self) -> int:
        return sum(u.size for u in self.removed)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape."""
        return {"directory": str(self.directory), "exists": self.exists, "dry_run": self.dry_run,
                "max_bytes": self.max_size, "older_than_days": self.older_than_days,
                "removed": [{"kind": u.kind, "path": str(u.path), "bytes": u.size, "last_used": u.last_used}
                            for u in self.removed], "freed_bytes": self.freed, "kept_bytes": self.kept_bytes}

    def summary(self) -> str:
        """One line."""
        if not self.exists:
            return (f"nothing to prune: {printable(str(self.directory))} is not created yet (wbfe creates it on "
                    "first use)\n")
        verb = "would remove" if self.dry_run else "removed"
        kinds = {k: sum(1 for u in self.removed if u.kind == k) for k in KINDS}
        what = ", ".join(f"{n} {k}" for k, n in kinds.items() if n) or "nothing"
        return (f"{verb} {what} ({format_size(self.freed)}) from {printable(str(self.directory))}; "
                f"{format_size(self.kept_bytes)} kept\n")


def _remove(root: Path, unit: CacheUnit) -> bool:
    # The parent is resolved (links and all): a unit whose folder leads out of the cache is never removed.
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(unit.path.parent)]) != real_root or unit.path.is_symlink():
        return False
    try:
        clear_path(unit.path)  # rmtree removes links inside, never their targets
    except OSError as exc:
        raise InvalidOptionError(f"cannot remove {unit.path} ({exc.strerror or exc}): prune a cache folder this user "
                                 "may write, or as its owner", path=str(unit.path)) from None
    return True


def _removable_claim(unit: CacheUnit, now: float) -> bool:
    try:
        age = now - os.lstat(unit.path).st_mtime  # reading a claim moves its access time, not its age
    except FileNotFoundError:
        return False
    owner = read_claim(unit.path)
    return owner is not None and is_stale(owner, age=age)


def prune_cache(directory: Union[str, Path, None] = None, *, max_size: Union[int, str, None] = DEFAULT_MAX_SIZE,
                older_than: Optional[float] = None, dry_run: bool = False,
                now: Optional[float] = None) -> PruneReport:
    """Remove cache units unused for ``older_than`` days, then the least recently used until ``max_size`` (bytes or
    text, ``20G``) holds; None for no rule. Stale claims and day-old partial copies are always removed, live
    claims never (docs/cache.md); ``now`` (seconds since the epoch) is for tests.

    Raises:
        InvalidOptionError: a negative or unparsable bound, ``directory`` is not a folder, or a named ``directory``
            does not exist.
    """
    bound = None if max_size is None else parse_size(max_size)
    if older_than is not None and not (isinstance(older_than, (int, float)) and math.isfinite(older_than)
                                       and older_than >= 0):
        shown = f"{older_than:g}" if isinstance(older_than, (int, float)) else repr(older_than)
        raise InvalidOptionError(f"--older-than must be a non-negative number of days, not {shown}")
    now = time.time() if now is None else now
    info = cache_info(directory)
    if not info.exists and not info.default:
        raise InvalidOptionError(f"no such cache folder: {info.directory}: give the folder wbfe caches into "
                                 "(wbfe cache info shows the default)", path=str(info.directory))
    report = PruneReport(info.directory, max_size=bound, older_than_days=older_than, dry_run=dry_run,
                         exists=info.exists)
    keep: list[CacheUnit] = []
    for unit in sorted(info.units, key=lambda u: u.last_used):
        if unit.kind == "claims":
            drop = _removable_claim(unit, now)
        elif unit.kind == "partial":
            drop = now - unit.last_used > _PARTIAL_AGE
        else:
            drop = older_than is not None and now - unit.last_used > older_than * 86400.0
        (report.removed if drop else keep).append(unit)
    if bound is not None:
        total = sum(u.size for u in keep)
        for unit in [u for u in keep if u.kind in ("entries", "hashes", "descriptions", "objects")]:  # oldest first
            if total <= bound:
                break
            report.removed.append(unit)
            total -= unit.size
    if not dry_run:
        report.removed = [u for u in report.removed if _remove(info.directory, u)]
    report.removed.sort(key=lambda u: u.last_used)
    report.kept_bytes = info.total - report.freed
    return report
