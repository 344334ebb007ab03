"""In-memory models: an ``nn.Module`` or a mapping of tensors (library use); the ``memory`` location."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

from wbfe._deps import require_torch
from wbfe.framework import describe_module
from wbfe.sources._base import Provenance, TensorEntry, TensorSource
from wbfe.sources.registry import register_location
from wbfe.sources.torch_pickle import tensor_entries, unwrap_checkpoint

__all__ = ["MemorySource", "is_in_memory"]


class MemorySource(TensorSource):
    """An in-memory ``nn.Module`` or state dict (tied parameters detected by shared storage)."""

    headers_only = True  # nothing to read: the tensors are in memory

    def __init__(self, obj: Any):
        torch = require_torch("scoring an in-memory model or state dict")  # its tensors are torch's
        while isinstance(getattr(obj, "_orig_mod", None), torch.nn.Module):  # torch.compile's wrapper: the model
            obj = obj._orig_mod
        state = obj.state_dict() if hasattr(obj, "state_dict") and callable(obj.state_dict) else obj
        self._state, self._passed = unwrap_checkpoint(state, where=type(obj).__name__)
        self.provenance = Provenance(
            source=f"<{type(obj).__name__}>", format="module" if state is not obj else "state_dict")
        # A module describes itself (order, head, ties, layouts: wbfe.framework); a state dict does not.
        self.own_description = describe_module(obj) if state is not obj else None

    def __len__(self) -> int:
        return len(self._state) + len(self._passed)

    def entries(self) -> Iterator[TensorEntry]:
        return self.described(tensor_entries(self._state, passed=self._passed))


def is_in_memory(ref: Any) -> bool:
    """Whether ``ref`` is an object holding tensors: a mapping, or anything with ``state_dict``."""
    return not isinstance(ref, (str, Path)) and (isinstance(ref, Mapping) or hasattr(ref, "state_dict"))


register_location("memory", order=10, claims=is_in_memory)(MemorySource)
