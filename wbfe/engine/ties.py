"""Tied weights: a tensor whose bytes equal an earlier one's (tied weights saved twice, or shared storage lost in a
format conversion) is scored once. A hash of a strided sample finds the candidates (hashing every byte costs more than
the Gram products); a candidate is confirmed by comparing all bytes with the earlier tensor, read again. Where a source
cannot read a tensor again, every byte is hashed."""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Optional

import numpy as np

from wbfe.linalg.arrays import dtype_name, flat_bytes
from wbfe.sources import TensorEntry

__all__ = ["SeenContent", "full_digest"]

_SAMPLE = 4096  # elements of a tensor hashed to find candidate duplicates


class SeenContent:
    """Remembers the tensors seen so far and finds an earlier one with the same bytes."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], list[tuple[str, Optional[Callable[[], Any]]]]] = {}

    def earlier_copy(self, entry: TensorEntry, tensor: Any) -> Optional[str]:
        """The name of an earlier tensor with the same bytes, else None (and remember this one)."""
        if entry.reread:
            flat = tensor.reshape(-1)
            key = (entry.shape, entry.dtype, "sample", full_digest(flat[:: max(1, math.prod(flat.shape) // _SAMPLE)]))
        else:
            key = (entry.shape, entry.dtype, "all", full_digest(tensor))
        candidates = self._seen.setdefault(key, [])
        for name, reread in candidates:
            if reread is None or _same_bytes(reread(), tensor):
                return name
        candidates.append((entry.name, entry.reread))
        return None


def full_digest(tensor: Any) -> str:
    """A digest of every byte of ``tensor`` (equal digests: equal bytes, to blake2b's certainty)."""
    return hashlib.blake2b(flat_bytes(tensor).data, digest_size=16).hexdigest()


def _same_bytes(a: Any, b: Any) -> bool:
    return bool(tuple(a.shape) == tuple(b.shape) and dtype_name(a) == dtype_name(b)
                and np.array_equal(flat_bytes(a), flat_bytes(b)))
