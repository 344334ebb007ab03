"""Errors about a local copy (in wbfe's object cache or the Hugging Face cache) re-said, with the same type
and fields, of the reference the user named rather than the cache path they never typed."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from wbfe.errors import WbfeError
from wbfe.sources._base import TensorEntry, TensorSource

__all__ = ["resay", "resaying", "said_of"]

T = TypeVar("T")


def resay(exc: WbfeError, local: Path, ref: str) -> WbfeError:
    """``exc`` with every mention of the folder ``local`` written as ``ref``: a new error of the same type and
    fields, or ``exc`` itself when it does not name ``local``."""
    where, ref = str(local), ref.rstrip("/")

    def said(value: Any) -> Any:
        return value.replace(where, ref) if isinstance(value, str) else value

    message = str(exc)
    fields = getattr(exc, "fields", {})
    if where not in message and not any(where in str(v) for v in fields.values()):
        return exc
    try:
        return type(exc)(said(message), **{k: said(v) for k, v in fields.items()})
    except TypeError:  # a subclass built otherwise: its own words are better than none
        return exc


def said_of(local: Path, ref: str, action: Callable[[], T]) -> T:
    """``action()``, a :class:`WbfeError` it raises re-said with ``ref`` for ``local`` (:func:`resay`)."""
    try:
        return action()
    except WbfeError as exc:
        raise resay(exc, local, ref) from None


def resaying(source: TensorSource, local: Path, ref: str) -> TensorSource:
    """``source`` (the same object, opened from the copy ``local`` of ``ref``) whose listing and reads re-say
    their errors with ``ref``."""
    listing = source.entries

    def entries() -> Iterator[TensorEntry]:
        found = said_of(local, ref, listing)
        while True:
            entry = said_of(local, ref, lambda: next(found, None))
            if entry is None:
                return
            yield dataclasses.replace(entry, load=functools.partial(said_of, local, ref, entry.load))

    # An instance attribute: the class's method stays what the engine's isinstance checks expect.
    source.entries = entries  # type: ignore[method-assign]
    return source
