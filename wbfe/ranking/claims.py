"""Claim files: one process at a time works on a cache entry, so two drivers on one zoo score each model once.

A claim is created with ``O_CREAT | O_EXCL``; the staleness rule is :func:`is_stale`'s (docs/cache.md). A stale
claim is renamed to a private tombstone before it is taken over, so of two processes only one wins.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = ["Claim", "try_claim", "read_claim", "is_stale", "process_start", "STALE_AFTER", "CLAIM_SUFFIX"]

STALE_AFTER = 6 * 3600.0
CLAIM_SUFFIX = ".claim"
_MAX_CLAIM_BYTES = 4096


def process_start(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot (Linux), None when unknown or gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode("ascii", "replace")
        # Field 22; the command name (field 2) is in parentheses and may hold spaces.
        return int(text[text.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:  # PermissionError: it exists, owned by someone else; ProcessLookupError: gone
        return isinstance(exc, PermissionError)
    return True


@dataclass
class Claim:
    """A held claim; release it (or use it as a context manager) when the work is done (the file is removed
    only while it holds ``token``)."""

    path: Path
    token: str
    released: bool = field(default=False, compare=False)

    def release(self) -> None:
        """Remove the claim file if it is still ours (a claim judged stale and taken over is not)."""
        if self.released:
            return
        self.released = True
        owner = read_claim(self.path)
        if owner is not None and owner.get("token") == self.token:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_claim(path: Path) -> Optional[dict[str, Any]]:
    """The owner record of a claim file; None when absent; ``{}`` when unreadable (a half-written or foreign file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(_MAX_CLAIM_BYTES)
    try:
        owner = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return {}
    return owner if isinstance(owner, dict) else {}


def is_stale(owner: dict[str, Any], *, age: float, stale_after: float = STALE_AFTER) -> bool:
    """Whether a claim with owner record ``owner`` (:func:`read_claim`'s), ``age`` seconds since its last change,
    may be taken over: its owner is on this host and gone (or its pid names a process started at another time),
    or it is older than ``stale_after`` (the only test for an owner on another host)."""
    if age > stale_after:
        return True
    pid, host = owner.get("pid"), owner.get("host")
    if not isinstance(pid, int) or not isinstance(host, str):
        return age > 10.0  # unreadable: stale once a writer has had time to fill it
    if host != socket.gethostname():
        return False
    if not _alive(pid):
        return True
    started = owner.get("started")
    return isinstance(started, int) and process_start(pid) not in (None, started)


def _create(path: Path) -> Optional[Claim]:
    token = secrets.token_hex(8)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": process_start(os.getpid()),
              "token": token, "time": time.time()}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    except FileExistsError:
        return None
    with os.fdopen(fd, "wb") as handle:
        handle.write(json.dumps(record).encode("utf-8"))
    return Claim(path, token)


def _take_over(path: Path, judged: dict[str, Any]) -> None:
    tomb = path.with_name(f".{path.name}.{secrets.token_hex(6)}.stale")
    try:
        os.rename(path, tomb)
    except FileNotFoundError:
        return  # released or taken over meanwhile: just try to create
    if read_claim(tomb) != judged:
        # Not the claim we judged (its owner replaced it in between): put it back unless a new one is there.
        with contextlib.suppress(OSError):
            os.link(tomb, path)
    tomb.unlink(missing_ok=True)


def try_claim(path: Path, *, stale_after: float = STALE_AFTER) -> Optional[Claim]:
    """Create the claim file ``path`` (and its folder), taking over a stale one; None when a live owner holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # the owner may release or a rival take over between our steps
        if (claim := _create(path)) is not None:
            return claim
        owner = read_claim(path)
        if owner is None:
            continue
        try:
            age = time.time() - path.lstat().st_mtime
        except FileNotFoundError:
            continue
        if not is_stale(owner, age=age, stale_after=stale_after):
            return None
        _take_over(path, owner)
    return None
