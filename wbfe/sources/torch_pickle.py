"""PyTorch checkpoints (``.bin .pt .pth .th``), loaded only with ``weights_only=True``.

A pickle that needs to import or call anything beyond tensors and containers is refused by
PyTorch's restricted unpickler and reported as :class:`UnsafePickleError`; its code never runs.
Zip-format files are memory-mapped; legacy (pre-1.6) files are read whole, as PyTorch requires.
"""

from __future__ import annotations

import pickle
import re
import struct
from pathlib import Path
from typing import Any, Iterator, Mapping

from wbfe.errors import CorruptCheckpointError, UnsafePickleError
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource

__all__ = ["TorchPickleSource", "load_torch_file", "unwrap_state_dict", "TORCH_SUFFIXES"]

TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".th", ".ckpt")
# Keys under which training scripts commonly nest the weights, in order of preference.
_NESTED_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network", "params", "weights")


def load_torch_file(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True`` (memory-mapped where possible), errors made typed.

    Raises:
        UnsafePickleError: the pickle references code (a global other than tensors and containers).
        CorruptCheckpointError: the file is not a readable PyTorch checkpoint (truncated, garbage).
    """
    import torch

    def _load(mmap: bool) -> Any:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)

    try:
        try:
            return _load(mmap=True)
        except RuntimeError as exc:
            if "mmap can only be used" not in str(exc):
                raise
            return _load(mmap=False)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        found = re.search(r"(?:Unsupported global: |unsupported )GLOBAL ([\w.]+)", text)
        if found or re.search(r"\b(global|GLOBAL|allowlisted|safe_globals)\b", text.split("WeightsUnpickler error:")[-1]):
            what = f" ({found.group(1)})" if found else ""
            raise UnsafePickleError(
                f"{path}: refused to load a pickle that needs code{what}; wbfe only loads weights "
                "(convert it to safetensors in a trusted environment)",
                path=str(path),
            ) from None
        detail = text.split("WeightsUnpickler error:")[-1].strip().split("\n")[0][:120]
        raise CorruptCheckpointError(f"{path}: not a readable PyTorch checkpoint ({detail})", path=str(path)) from None
    except (RuntimeError, KeyError, EOFError, ValueError, OSError, AttributeError, IndexError, struct.error) as exc:
        detail = str(exc).split(". ")[0][:160]
        raise CorruptCheckpointError(
            f"{path}: not a readable PyTorch checkpoint (truncated or corrupt: {exc.__class__.__name__}: {detail})",
            path=str(path),
        ) from None


def unwrap_state_dict(obj: Any, *, where: str) -> dict[str, Any]:
    """Find the mapping of tensors inside a loaded checkpoint and strip a DataParallel ``module.`` prefix.

    Raises:
        CorruptCheckpointError: no mapping of tensors can be found.
    """
    import torch

    current = obj
    for _ in range(4):
        if isinstance(current, Mapping) and any(isinstance(v, torch.Tensor) for v in current.values()):
            state = {str(k): v for k, v in current.items() if isinstance(v, torch.Tensor)}
            if state and all(k.startswith("module.") for k in state):
                state = {k[len("module."):]: v for k, v in state.items()}
            return state
        if not isinstance(current, Mapping):
            break
        nested = [k for k in _NESTED_KEYS if isinstance(current.get(k), Mapping)]
        if nested:
            current = current[nested[0]]
            continue
        mappings = [v for v in current.values() if isinstance(v, Mapping)]
        if len(mappings) == 1:
            current = mappings[0]
            continue
        break
    keys = list(obj.keys())[:8] if isinstance(obj, Mapping) else type(obj).__name__
    raise CorruptCheckpointError(f"{where}: no state dict of tensors found (top level: {keys})", path=where)


def dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def tensor_entries(state: Mapping[str, Any], *, held: bool = True, scope: Any = None) -> Iterator[TensorEntry]:
    """Entries of an in-memory state dict; tied tensors share a ``storage_key``.

    ``held``: the state dict outlives the stream, so an entry can be read again at no cost.
    ``scope``: part of every storage key; a freed shard's addresses are reused by the next one.
    """
    for name, tensor in state.items():
        t = tensor.detach()
        key = None
        if t.device.type != "meta" and t.numel() > 0:
            key = (scope, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        load = lambda t=t: t  # noqa: E731
        yield TensorEntry(name=name, shape=tuple(t.shape), dtype=dtype_name(t), load=load, storage_key=key,
                          reread=load if held else None)


class TorchPickleSource(TensorSource):
    """Tensors of one or more PyTorch pickle files (shards are loaded one at a time)."""

    def __init__(self, ref: str, files: list[Path], *, index: Path | None = None):
        self._files = list(files)
        self._index = index
        self._length: int | None = None
        if index is not None:
            from wbfe.sources.safetensors_files import read_index

            self._length = sum(len(v) for v in read_index(index).values())
        else:
            # One file: load it now, so errors surface before any work and len() is known.
            self._state: dict[str, Any] | None = unwrap_state_dict(load_torch_file(files[0]), where=str(files[0]))
            self._length = len(self._state)
        self.provenance = Provenance(
            source=ref,
            format="torch-sharded" if index is not None else "torch",
            files=[str(p) for p in ([index] if index else []) + self._files],
            pending=FileDigest(self._files),
        )

    def __len__(self) -> int:
        assert self._length is not None
        return self._length

    def entries(self) -> Iterator[TensorEntry]:
        if self._index is None:
            state, self._state = self._state, None
            assert state is not None
            yield from tensor_entries(state)
            return
        for path in self._files:
            # A shard's tensors go with it: holding one to reread would hold the whole shard's map.
            state = unwrap_state_dict(load_torch_file(path), where=str(path))
            yield from tensor_entries(state, held=False, scope=str(path))

    def close(self) -> None:
        super().close()
        self._state = None
