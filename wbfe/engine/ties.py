"""Tied weights: a tensor whose bytes equal an earlier one's (tied weights saved twice, or shared storage lost in a
format conversion) is scored once, found by a digest of every byte."""

from __future__ import annotations

import hashlib
from typing import Any, Optional

from wbfe.engine.matrices import Skip
from wbfe.linalg.arrays import flat_bytes
from wbfe.sources import TensorEntry

__all__ = ["SeenContent", "full_digest", "shared_storage"]


def shared_storage(entry: TensorEntry, storage: dict[Any, str]) -> Optional[Skip]:
    """Why ``entry`` is skipped where it shares storage with an earlier matrix (known from the headers: a score and
    a description skip the same names), else None, with its storage remembered in ``storage``."""
    if entry.storage_key is None:
        return None
    if entry.storage_key in storage:
        return Skip(entry.name, f"tied: shares storage with {storage[entry.storage_key]}", entry.shape, entry.dtype)
    storage[entry.storage_key] = entry.name
    return None


class SeenContent:
    """Remembers the tensors seen so far and finds an earlier one with the same bytes."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], str] = {}

    def earlier_copy(self, entry: TensorEntry, tensor: Any) -> Optional[str]:
        """The name of an earlier tensor with the same bytes, else None (and remember this one)."""
        key = (entry.shape, entry.dtype, full_digest(tensor))
        if key in self._seen:
            return self._seen[key]
        self._seen[key] = entry.name
        return None


def full_digest(tensor: Any) -> str:
    """A digest of every byte of ``tensor`` (equal digests: equal bytes, to blake2b's certainty)."""
    return hashlib.blake2b(flat_bytes(tensor).data, digest_size=16).hexdigest()
