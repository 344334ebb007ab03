"""The size bound on object-store copies (``$WBFE_CACHE_DIR/objects``), applied as each new copy lands:
the least recently used other copies are removed until they fit ``$WBFE_CACHE_MAX_SIZE`` (docs/cache.md)."""

from __future__ import annotations

import math
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Optional, Union

from wbfe._config import wbfe_cache_max_size
from wbfe.errors import InvalidOptionError

__all__ = ["DEFAULT_MAX_SIZE", "MAX_SIZE_ENV", "NO_BOUND", "parse_size", "format_size", "object_cache_bound", "evict_objects"]

DEFAULT_MAX_SIZE = 20 * 2**30  # 20 GiB: a few LLM copies; score entries are a few KB each
MAX_SIZE_ENV = "WBFE_CACHE_MAX_SIZE"
NO_BOUND = "none"  # the one word for no size bound, in $WBFE_CACHE_MAX_SIZE and `wbfe cache prune --max-size`
_UNITS = {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_OBJECT = re.compile(r"^[0-9a-f]{64}$")
_SHARD = re.compile(r"^[0-9a-f]{2}$")


def parse_size(text: Union[str, int]) -> int:
    """Bytes from ``500M``, ``20G``, ``1.5T``, ``2GiB``, ``123`` (powers of 1024; ``InvalidOptionError``)."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([BKMGT]?)(?:I?B)?\s*", str(text).upper())
    value = float(match.group(1)) * _UNITS[match.group(2) or "B"] if match else math.inf
    if not math.isfinite(value):
        raise InvalidOptionError(f"not a size: {text!r} (e.g. 500M, 20G, 1.5T)")
    return int(value)


def format_size(n: float) -> str:
    """``1.5 GiB``-style text for a byte count, in the powers of 1024 that :func:`parse_size` reads."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def object_cache_bound() -> Optional[int]:
    """The bound from ``$WBFE_CACHE_MAX_SIZE`` (read at call time), else the default; None for ``none``."""
    text = wbfe_cache_max_size()
    if not text:
        return DEFAULT_MAX_SIZE
    if text.strip().lower() == NO_BOUND:
        return None
    try:
        return parse_size(text)
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"{MAX_SIZE_ENV}: {exc}") from None


def tree_usage(path: Path) -> tuple[int, float]:
    """Bytes of a folder's files and their latest use (atime/mtime); links counted as themselves, never entered."""
    size, latest = 0, os.lstat(path).st_mtime
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files + dirs:
            st = os.lstat(os.path.join(root, name))
            if not stat.S_ISDIR(st.st_mode):
                size += st.st_size
            latest = max(latest, st.st_atime, st.st_mtime)
    return size, latest


def _copies(objects: Path) -> list[tuple[float, int, Path]]:
    found = []
    for copy in sorted(objects.glob("*/*")):
        named = _SHARD.match(copy.parent.name) and _OBJECT.match(copy.name)
        if not named or any(p.is_symlink() or not p.is_dir() for p in (copy.parent, copy)):
            continue  # a partial copy, or something wbfe did not write
        try:
            size, used = tree_usage(copy)
        except FileNotFoundError:  # removed by another process meanwhile
            continue
        found.append((used, size, copy))
    return found


def evict_objects(objects: Path, *, keep: Path, bound: Optional[int]) -> list[Path]:
    """Remove the least recently used copies under ``objects`` other than ``keep`` until the copies
    fit ``bound`` bytes (None: no bound); returns the copies removed, least recently used first."""
    if bound is None:
        return []
    copies = _copies(objects)
    total = sum(size for _, size, _ in copies)
    removed = []
    for _, size, copy in sorted(copies, key=lambda c: (c[0], c[2].name)):
        if total <= bound:
            break
        if copy == keep:
            continue
        shutil.rmtree(copy, ignore_errors=True)
        removed.append(copy)
        total -= size
    return removed
