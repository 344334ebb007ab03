"""Messages other libraries print while wbfe works (transformers' notices, Ray's warnings): inside
:func:`captured`, Python warnings raised outside wbfe and the records of loggers handed to :func:`route_logger`
are collected, each distinct one once, instead of going to stderr (the command line shows them with
``--verbose``). Outside :func:`captured` (wbfe used as a library) nothing changes."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

__all__ = ["Note", "Notes", "captured", "route_logger"]


@dataclass(frozen=True)
class Note:
    """One message another library gave: ``source`` (``transformers``, ``ray``, a warning's category) and its text."""

    source: str
    text: str

    def line(self) -> str:
        return f"{self.source}: {' '.join(self.text.split())}"


@dataclass
class Notes:
    """The distinct messages held back while :func:`captured` was active, in the order first given."""

    notes: list[Note] = field(default_factory=list)
    repeats: int = 0

    def add(self, note: Note) -> None:
        if note in self.notes:
            self.repeats += 1
        else:
            self.notes.append(note)

    def summary(self) -> Optional[str]:
        """One line saying what was held back and how to see it; None when nothing was."""
        if not self.notes:
            return None
        n = len(self.notes)
        return (f"{n} message{'s' if n > 1 else ''} from {', '.join(dict.fromkeys(n.source for n in self.notes))} held back "
                "(--verbose shows them)")


_lock = threading.Lock()
_active: list[Notes] = []


def _route(source: str, record: logging.LogRecord) -> bool:
    """A filter on a library's own handlers: a record goes to the active :class:`Notes` instead of the handler."""
    with _lock:
        notes = _active[-1] if _active else None
    if notes is None:
        return True
    try:
        notes.add(Note(source, record.getMessage()))
    except Exception:  # noqa: BLE001 - a malformed record is passed through, as logging would
        return True
    return False


_routed: dict[str, "functools.partial[bool]"] = {}


def route_logger(name: str) -> None:
    """Route the records of library logger ``name`` (and its children's, which propagate to it) into
    wbfe's diagnostics while :func:`captured` is active; call it once the library is imported (its
    handlers are set up then). A logger that propagates to the root with no handler of its own is
    given none: logging's last resort prints nothing below WARNING, and the filter then sits on it."""
    with _lock:
        found = _routed.setdefault(name, functools.partial(_route, name))
    handlers = logging.getLogger(name).handlers or ([logging.lastResort] if logging.lastResort is not None else [])
    for handler in handlers:
        handler.addFilter(found)  # which adds it once


@contextlib.contextmanager
def captured() -> Iterator[Notes]:
    """Collect other libraries' warnings and routed log records for the duration of the block."""
    notes = Notes()
    with _lock:
        _active.append(notes)
    with warnings.catch_warnings():
        previous = warnings.showwarning

        def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if "/wbfe/" in filename.replace("\\", "/"):  # wbfe's own warnings are not another library's
                previous(message, category, filename, lineno, file, line)
                return
            notes.add(Note(_library(filename, category), str(message)))

        warnings.showwarning = show
        try:
            yield notes
        finally:
            with _lock:
                _active.remove(notes)


def _library(filename: str, category: type) -> str:
    """The top-level package a warning came from (``site-packages/<name>/...``), else its category."""
    parts = filename.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return parts[parts.index(marker) + 1].removesuffix(".py")
    return category.__name__
