"""PyTorch checkpoints (``.bin .pt .pth .th``), loaded only with ``weights_only=True``: a pickle that needs
code is refused (:class:`UnsafePickleError`) and never runs. Zip-format files are memory-mapped."""

from __future__ import annotations

import dataclasses
import pickle
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from wbfe._deps import require_torch
from wbfe.errors import CorruptCheckpointError, UnsafePickleError
from wbfe.linalg.arrays import dtype_name
from wbfe.sources._base import (TORCH_SUFFIXES, FileDigest, Provenance, TensorEntry, TensorSource, open_regular,
    unreadable)
from wbfe.sources.registry import ZIP_ERRORS, FileFormat, register_format
from wbfe.sources.torch_legacy import check_legacy_records

__all__ = ["TorchPickleSource", "load_torch_file", "unwrap_checkpoint", "tensor_entries",
           "check_zip_records", "TORCH", "TORCH_SUFFIXES"]

# Keys under which training scripts commonly nest the weights, in order of preference.
_NESTED_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network", "params", "weights")
# An exponential moving average of the weights (timm's, torchvision's and DeiT's training scripts save it beside the
# model): scored only where none of the above holds tensors, else listed as skipped.
_EMA_KEYS = ("model_ema", "state_dict_ema", "ema_state_dict", "ema")
_ZIP_MAGIC = b"PK\x03\x04"


def load_torch_file(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True`` (memory-mapped where possible), errors made typed; a zip
    file's records must pass their CRC-32 check first (torch does not check them); torch's warnings are not shown.

    Raises:
        UnsafePickleError: the pickle references code (a global other than tensors and containers).
        CorruptCheckpointError: not a readable PyTorch checkpoint, or not a regular file.
        SourceNotFoundError, MissingDependencyError: the file cannot be read; torch is not installed.
    """
    require_torch("reading a PyTorch pickle")
    import torch

    with open_regular(path) as fh:
        try:
            # torch maps a zip file only, which it also tells by these first bytes; it checks the records of
            # neither (a legacy file's storages it fills without checking them)
            zipped = fh.read(4) == _ZIP_MAGIC
            (check_zip_records if zipped else check_legacy_records)(path, fh)
        except OSError as exc:
            raise unreadable(path, exc) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        tail = text.split("WeightsUnpickler error:")[-1]
        found = re.search(r"(?:Unsupported global: |unsupported )GLOBAL ([\w.]+)", text)
        if found or re.search(r"\b(global|GLOBAL|allowlisted|safe_globals)\b", tail):
            what = f" ({found.group(1)})" if found else ""
            raise UnsafePickleError.at(path, f"refused to load a pickle that needs code{what}; wbfe only loads weights "
                "(convert it to safetensors in a trusted environment)") from None
        detail = _safe_detail(tail.strip().split("\n")[0][:120])
        raise CorruptCheckpointError.at(path, f"not a readable PyTorch checkpoint ({detail})") from None
    except (RuntimeError, KeyError, EOFError, ValueError, OSError, AttributeError, IndexError, TypeError,
            struct.error, MemoryError, RecursionError, NotImplementedError, AssertionError) as exc:
        # AssertionError: torch's legacy loader asserts on the file's content ("storage key not found").
        detail = _safe_detail(str(exc).split(". ")[0][:160])
        raise CorruptCheckpointError.at(path, "not a readable PyTorch checkpoint (truncated or corrupt: "
                                        f"{exc.__class__.__name__}: {detail})") from None


def _safe_detail(text: str) -> str:
    """An error text of torch or pickle without the file's bytes it may quote (``invalid load key, 'r'``)."""
    return re.sub(r"(invalid load key)[^.]*", r"\1", text)


def check_zip_records(path: Path, fh: Any) -> None:
    """Read every record of a zip-format checkpoint through its CRC-32, as torch does not (a compressed
    record, which torch never writes, is refused rather than inflated)."""
    try:
        with zipfile.ZipFile(fh) as archive:
            compressed = any(info.compress_type != zipfile.ZIP_STORED for info in archive.infolist())
            bad = None if compressed else archive.testzip()
    except ZIP_ERRORS as exc:
        raise CorruptCheckpointError.at(
            path, f"not a readable PyTorch checkpoint (a damaged zip archive: {exc.__class__.__name__})") from None
    if compressed:
        raise CorruptCheckpointError.at(path, "not a PyTorch checkpoint (a compressed zip record; torch.save stores "
                                        "them uncompressed)")
    if bad is not None:
        raise CorruptCheckpointError.at(path, "corrupt PyTorch checkpoint (a data record fails its CRC-32 check)")


def unwrap_checkpoint(obj: Any, *, where: str) -> tuple[dict[str, Any], dict[str, tuple[Any, str]]]:
    """The tensors of a loaded checkpoint's state dict by dotted name, DataParallel's ``module.`` and torch.compile's
    ``_orig_mod.`` prefixes stripped (``CorruptCheckpointError`` where there is none, or two names clash); and, by
    ``key/name`` with why each is not scored, those of every container beside it (another state dict it was chosen
    over: the first of :data:`_NESTED_KEYS`, then :data:`_EMA_KEYS`, that holds tensors is scored; an optimizer's)."""
    import torch

    current = obj
    passed: dict[str, tuple[Any, str]] = {}
    flat: dict[str, Any] | None = None  # current's tensors, where flattened already (chosen among candidates)
    for _ in range(4):
        if isinstance(current, Mapping) and any(_is_tensor(torch, v) for v in current.values()):
            state = flat if flat is not None else _flatten(current, where)
            # DataParallel's and torch.compile's wrappers, in either order (a compiled model's weights saved as
            # _orig_mod.fc.weight matched no plain model's names)
            while state and (prefix := next((p for p in ("module.", "_orig_mod.")
                                             if all(k.startswith(p) for k in state)), None)):
                state = {k[len(prefix):]: v for k, v in state.items()}
            return state, passed
        if not isinstance(current, Mapping):
            break
        candidates = [k for k in _NESTED_KEYS + _EMA_KEYS if isinstance(current.get(k), Mapping)]
        held: dict[str, dict[str, Any]] = {}
        if len(candidates) > 1:  # the first that holds tensors is scored
            held = {k: _flatten(current[k], where) for k in candidates}
            candidates = [k for k in candidates if held[k]] or candidates
        nested = [current[k] for k in candidates]
        if not nested:  # else the one mapping inside, if there is one only
            nested = [v for v in current.values() if isinstance(v, Mapping)]
            if len(nested) != 1:
                break
        # The tensors beside the state dict scored (another state dict, an optimizer's moments) are listed, not lost.
        for other, value in current.items():
            if value is not nested[0] and isinstance(value, (Mapping, list, tuple)):
                why = (f"optimizer state (in {other!r}), not a weight" if _is_optimizer(other, value) else
                       f"in {other!r}, not the state dict scored ({candidates[0]!r}); score checkpoint[{other!r}] for "
                       "it" if other in candidates else f"in {other!r}, beside the state dict scored: not a weight")
                found = held[other] if other in held else _flatten(value, where)
                passed.update({f"{other}/{name}": (tensor, why) for name, tensor in found.items()})
        current = nested[0]
        flat = held.get(candidates[0]) if held else None
    keys = [str(k)[:80] for k in list(obj.keys())[:8]] if isinstance(obj, Mapping) else type(obj).__name__
    raise CorruptCheckpointError.at(where, f"no state dict of tensors found (top level: {keys})")


def _is_optimizer(key: Any, value: Any) -> bool:
    """Whether ``value`` (under ``key``) is an optimizer's state: a torch optimizer's state dict (``state`` and
    ``param_groups``) or a list of them (Lightning's ``optimizer_states``), or anything under an ``optim…`` key."""
    if isinstance(value, (list, tuple)) and value and all(_is_optimizer(None, v) for v in value):
        return True
    return "optim" in str(key).lower() or isinstance(value, Mapping) and {"state", "param_groups"} <= value.keys()


def _is_tensor(torch: Any, value: Any) -> bool:
    """Whether ``value`` is a torch tensor or a numeric numpy array (which :func:`_flatten` reads as one)."""
    return isinstance(value, torch.Tensor) or (isinstance(value, np.ndarray) and value.dtype.kind in "biufc")


def _flatten(state: Mapping[Any, Any] | list[Any] | tuple[Any, ...], where: str) -> dict[str, Any]:
    """Tensors (and numeric numpy arrays) of ``state`` and its containers by dotted path, each container seen once."""
    import torch

    out: dict[str, Any] = {}
    seen = {id(state)}
    stack: list[tuple[str, Any]] = [("", state)]
    while stack:
        prefix, container = stack.pop()
        items = container.items() if isinstance(container, Mapping) else enumerate(container)
        children = []
        for key, value in items:
            name = f"{prefix}{key}"
            if _is_tensor(torch, value):
                if name in out:
                    raise CorruptCheckpointError.at(
                        where, f"two tensors are both named {name[:200]!r} once nested names are joined")
                # a numpy array shared, a read-only one copied
                out[name] = value if isinstance(value, torch.Tensor) else torch.from_numpy(
                    value if value.flags.writeable else value.copy())
            elif isinstance(value, (Mapping, list, tuple)) and id(value) not in seen:
                seen.add(id(value))
                children.append((f"{name}.", value))
        stack.extend(reversed(children))
    return out


def unreadable_reason(tensor: Any) -> str | None:
    """Why a tensor cannot be read as a dense matrix without unbounded work (a stride-0 view larger than its
    storage: a few bytes can describe an n × n matrix), or None."""
    import torch

    if tensor.layout != torch.strided:
        return f"{str(tensor.layout).removeprefix('torch.')} tensor: wbfe reads dense weights only"
    if tensor.device.type == "meta":
        return "meta-device tensor: the checkpoint holds no values for it"
    if tensor.numel() == 0:
        return None
    need = tensor.numel() * tensor.element_size()
    have = tensor.untyped_storage().nbytes()
    if need > have:
        return (f"stride-0 (expanded) storage: its {tensor.numel()} elements view {have} bytes of storage; "
                "not materialised")
    return None


LAZY_REASON = "uninitialised lazy parameter: run the model once before scoring"


def tensor_entries(state: Mapping[str, Any], *, scope: Any = None,
                   passed: Mapping[str, tuple[Any, str]] | None = None) -> Iterator[TensorEntry]:
    """Entries of an in-memory state dict; tied tensors share a ``storage_key``. ``scope``: part of every key (a
    freed shard's addresses are reused); ``passed``: tensors listed as skipped after them, with their reasons
    (:func:`unwrap_checkpoint`)."""
    from torch.nn.parameter import is_lazy

    for name, tensor in state.items():
        if is_lazy(tensor):  # a LazyLinear never run: no shape, no values; torch raises on any use
            yield TensorEntry(name=name, shape=(), dtype=dtype_name(tensor), load=_no_values, skip=LAZY_REASON)
            continue
        t = tensor.detach()
        skip = unreadable_reason(t)
        key = (scope, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
               t.dtype) if skip is None and t.numel() > 0 else None
        load = lambda t=t: t  # noqa: E731
        yield TensorEntry(name=name, shape=tuple(t.shape), dtype=dtype_name(t), load=load, storage_key=key, skip=skip)
    for name, (tensor, why) in (passed or {}).items():
        lazy = is_lazy(tensor)
        # Not scored, but what copies every tensor (prune, smooth) copies it as it is.
        yield TensorEntry(name=name, shape=() if lazy else tuple(tensor.shape), dtype=dtype_name(tensor),
                          load=_no_values if lazy else tensor.detach, skip=why)


def _no_values() -> Any:
    """What an uninitialised lazy parameter holds: a meta tensor, which what copies tensors refuses saying why."""
    import torch

    return torch.empty(0, device="meta")


class TorchPickleSource(TensorSource):
    """Tensors of a PyTorch pickle file, or of the shards a ``*.index.json`` lists (loaded one at a time)."""

    def __init__(self, path: Path, ref: str, fmt: str | None = None):
        require_torch("reading a PyTorch pickle")
        self._index = path if path.name.lower().endswith(".index.json") else None
        self._listed: list[list[str]] = []
        self._passed: dict[str, tuple[Any, str]] = {}  # a single file's other state dict (unwrap_checkpoint)
        if self._index is not None:
            from wbfe.sources.safetensors_files import index_shards

            shards = index_shards(self._index)
            self._files = [shard for shard, _ in shards]
            self._listed = [names for _, names in shards]
            self._length = sum(len(names) for names in self._listed)
        else:
            # One file: load it now, so errors surface before any work and len() is known.
            self._files = [path]
            self._state: dict[str, Any] | None
            self._state, self._passed = unwrap_checkpoint(load_torch_file(path), where=str(path))
            self._length = len(self._state) + len(self._passed)
        self.provenance = Provenance(source=ref, format="torch-sharded" if self._index else "torch",
            files=[str(p) for p in ([self._index] if self._index else []) + self._files],
            pending=FileDigest(self._files))

    def __len__(self) -> int:
        return self._length

    def entries(self) -> Iterator[TensorEntry]:
        return self.described(self._entries())

    def _entries(self) -> Iterator[TensorEntry]:
        if self._index is None:
            state, passed = self._state, self._passed
            if state is None:  # a second pass (an edit reads the entries three times): the file again, mapped
                state, passed = unwrap_checkpoint(load_torch_file(self._files[0]), where=str(self._files[0]))
            self._state, self._passed = None, {}  # the tensors go with the pass, not with the source
            yield from tensor_entries(state, passed=passed)
            return
        from wbfe.sources.safetensors_files import copy_row, unlisted_reason

        indexed = {name: path.name for path, names in zip(self._files, self._listed) for name in names}
        reported: set[str] = set()  # unlisted names already skipped: a name is one row
        holders: dict[str, list[str]] = {}  # the shards read so far holding a copy of a listed name
        copies: list[tuple[str, TensorEntry]] = []  # copies of a listed name in another shard: rows once all are read
        for path, listed in zip(self._files, self._listed):
            state, passed = unwrap_checkpoint(load_torch_file(path), where=str(path))
            missing = [t for t in listed if t not in state]
            own = set(listed)
            if missing:
                raise CorruptCheckpointError.at(path, f"tensor {missing[0]!r} listed in the index is not in this shard")
            for entry in tensor_entries(state, scope=str(path), passed=passed):
                # Another state dict's tensor (skipped, as for a single file) or a name the index does not list is one
                # row, from the first shard holding it; a listed name is read from the shard the index gives it to.
                if entry.name in passed or entry.name not in indexed:
                    if entry.name in reported:
                        continue
                    reported.add(entry.name)
                    if entry.name not in passed:  # as for safetensors shards: accounted for, not scored
                        entry = dataclasses.replace(entry, skip=unlisted_reason([path.name], self._index.name))
                else:
                    holders.setdefault(entry.name, []).append(path.name)
                    if entry.name not in own:  # the index gives it to another shard: this copy is a row of its own
                        copies.append((path.name, entry))
                        continue
                yield entry
        for shard, entry in copies:  # which copy transformers takes is known once every shard is read
            row, why = copy_row(entry.name, shard, indexed[entry.name], holders[entry.name], self._index.name)
            yield dataclasses.replace(entry, name=row, skip=why, copy_of=entry.name)

    def close(self) -> None:
        super().close()
        self._state = None


TORCH = register_format(FileFormat(name="torch", suffixes=TORCH_SUFFIXES, open=TorchPickleSource,
    index_suffixes=tuple(s + ".index.json" for s in TORCH_SUFFIXES), named_suffixes=(".index.json",),
    preferred="pytorch_model.bin", group="torch", rank=20))
