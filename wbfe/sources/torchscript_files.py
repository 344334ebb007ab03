"""TorchScript archives (``torch.jit.save``), read without loading or running the scripted code: the pickles
through a restricted unpickler (``_ALLOWED``; every ``__torch__`` class an inert record of its state), the
code only as text for each class's parameters and buffers (docs/checkpoints.md).
"""

from __future__ import annotations

import functools
import math
import pickle
import re
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from wbfe._deps import require_torch
from wbfe.errors import CorruptCheckpointError, UnsafePickleError, WbfeError
from wbfe.linalg.arrays import itemsize
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource
from wbfe.sources.io import reading_zip
from wbfe.sources.registry import ZIP_ERRORS, FileFormat, register_format, zip_members
from wbfe.sources.signal_constants import DFT_REASON, dft_shaped, is_dft_basis, name_reason, signal_name

if TYPE_CHECKING:
    import torch

__all__ = ["TorchScriptSource", "is_torchscript", "TORCHSCRIPT"]

# Storage classes a TorchScript pickle names -> torch dtype names.
_STORAGES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool"}
# A class of the archive's code: its parameters and buffers (TorchScript's printer writes these
# two lines first in every module class).
_DECLARED = re.compile(r"^class (\w+)\(Module\):\n\s+__parameters__ = \[([^\]]*)\]\n\s+__buffers__ = \[([^\]]*)\]",
                       re.M)
_CODE_BYTES = 64 << 20  # a code file larger than this is not read for declarations


def is_torchscript(head: bytes, path: Path) -> bool:
    """A zip holding ``<name>/data.pkl``, ``<name>/constants.pkl`` and ``<name>/code/`` (``torch.save``'s has no code)."""
    if head[:4] != b"PK\x03\x04":
        return False
    members = zip_members(path)
    prefixes = {m.split("/", 1)[0] for m in members if m.endswith("/constants.pkl") and m.count("/") == 1}
    return any(f"{p}/data.pkl" in members and any(m.startswith(f"{p}/code/") for m in members) for p in prefixes)


@dataclass(frozen=True)
class _Storage:
    member: str
    dtype: str
    numel: int


@dataclass(frozen=True)
class _TensorRef:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _Scripted:
    """An object of a ``__torch__`` class: its state, never its code."""

    qualname = "__torch__"

    def __init__(self, *args: Any) -> None:
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


_CLASSES: dict[str, type] = {}


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> _TensorRef:
    if not isinstance(storage, _Storage) or not _ints(offset) or not _ints(*size) or not _ints(*stride) \
            or len(size) != len(stride):
        raise CorruptCheckpointError("a tensor record with an invalid storage, size or stride")
    return _TensorRef(storage, int(offset), tuple(int(s) for s in size), tuple(int(s) for s in stride))


def _ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def _first(value: Any, *rest: Any) -> Any:
    return value


# The only globals the unpickler resolves, each to wbfe's own function or a container.
_ALLOWED: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _first,  # (data, requires_grad, hooks): the data
    ("collections", "OrderedDict"): OrderedDict,
    ("torch.jit._pickle", "restore_type_tag"): _first,
    **{("torch.jit._pickle", f"build_{kind}list"): _first for kind in ("int", "double", "bool", "tensor")},
}


class _Unpickler(pickle.Unpickler):
    """Resolves ``_ALLOWED`` globals, storage types and ``__torch__`` classes; refuses the rest."""

    def __init__(self, file: Any, folder: str):
        super().__init__(file)
        self.folder = folder

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in _STORAGES:
            return _STORAGES[name]
        if module == "__torch__" or module.startswith("__torch__."):
            qualname = f"{module}.{name}"
            return _CLASSES.setdefault(qualname, type("Scripted", (_Scripted,), {"qualname": qualname}))
        raise UnsafePickleError(f"refused to load a TorchScript pickle that needs {module}.{name}")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] in _STORAGES.values()
                and isinstance(pid[2], str) and pid[2].isalnum() and _ints(pid[4])):
            raise CorruptCheckpointError(f"an unknown storage record {str(pid)[:80]}")
        return _Storage(f"{self.folder}/{pid[2]}", pid[1], int(pid[4]))


# What reading a pickle from a damaged archive raises: the unpickler's errors and the zip's (ZIP_ERRORS).
_PICKLE_ERRORS: tuple[type[BaseException], ...] = (
    pickle.UnpicklingError, TypeError, AttributeError, IndexError, KeyError, MemoryError, RecursionError, *ZIP_ERRORS)


class TorchScriptSource(TensorSource):
    """The tensors of a TorchScript archive, read one storage at a time."""

    def __init__(self, path: Path, ref: str, fmt: Optional[str] = None):
        require_torch("reading a TorchScript archive")
        self._path = path
        with reading_zip(path, "TorchScript archive") as archive:
            members = set(archive.namelist())
            found = sorted(m.split("/", 1)[0] for m in members if m.count("/") == 1 and m.endswith("/data.pkl"))
            if not found or f"{found[0]}/constants.pkl" not in members:
                raise CorruptCheckpointError.at(path, "not a TorchScript archive (no data.pkl and constants.pkl)")
            prefix = found[0]
            order = archive.read(f"{prefix}/byteorder").strip() if f"{prefix}/byteorder" in members else b""
            if order not in (b"little", b""):  # no record: written before byteorder was, little-endian
                raise CorruptCheckpointError.at(path, "a big-endian TorchScript archive")
            tree = self._unpickle(archive, f"{prefix}/data.pkl", f"{prefix}/data")
            constants = self._unpickle(archive, f"{prefix}/constants.pkl", f"{prefix}/constants")
            declared = _declarations(archive, prefix)
            self._offsets = {i.filename: i for i in archive.infolist()}
        self._tensors, self._kinds = _collect(tree, constants, declared)
        for name, t in self._tensors:
            if t.storage.member not in members:
                raise CorruptCheckpointError.at(path, f"tensor {name!r} names a missing record {t.storage.member}")
        self.provenance = Provenance(source=ref, format="torchscript", files=[str(path)], pending=FileDigest([path]))

    def _unpickle(self, archive: zipfile.ZipFile, member: str, folder: str) -> Any:
        try:
            with archive.open(member) as fh:
                return _Unpickler(fh, folder).load()
        except UnsafePickleError as exc:
            raise UnsafePickleError.at(self._path, f"{exc}; wbfe never runs a checkpoint's code") from None
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError.at(self._path, str(exc)) from None
        except _PICKLE_ERRORS as exc:
            raise CorruptCheckpointError.at(self._path, f"unreadable TorchScript {member.split('/')[-1]} "
                                            f"({exc.__class__.__name__})") from None

    def __len__(self) -> int:
        return len(self._tensors)

    @functools.cached_property
    def _signal(self) -> dict[str, str]:
        """Why each buffer, attribute or constant that is a signal-processing constant is skipped."""
        signal: dict[str, str] = {}
        for name, ref in self._tensors:
            if self._kinds.get(name) == "parameter" or _unreadable(ref) is not None:
                continue
            found = signal_name([name])
            if found is not None:
                signal[name] = name_reason(found)
            elif dft_shaped(ref.size) and ref.storage.dtype.startswith(("float", "bfloat")):
                try:
                    values = self.read(ref).float().numpy()
                except WbfeError:  # a damaged record: its own read says so, when scored
                    continue
                if is_dft_basis(values):
                    signal[name] = DFT_REASON
        return signal

    def entries(self) -> Iterator[TensorEntry]:
        for name, ref in self._tensors:
            skip = _unreadable(ref) or self._signal.get(name)
            key = (ref.storage.member, ref.offset, ref.size, ref.stride) if skip is None else None
            yield TensorEntry(name=name, shape=ref.size, dtype=ref.storage.dtype, storage_key=key, skip=skip,
                              load=functools.partial(self.read, ref))

    def read(self, ref: _TensorRef) -> "torch.Tensor":
        """The tensor ``ref`` describes, read from its storage record."""
        import torch

        info = self._offsets[ref.storage.member]
        nbytes = ref.storage.numel * itemsize(ref.storage.dtype)
        if info.file_size != nbytes:
            raise CorruptCheckpointError.at(
                self._path, f"record {info.filename} holds {info.file_size} bytes, its storage needs {nbytes}")
        why = f"record {info.filename} unreadable"
        with reading_zip(self._path, "TorchScript archive", lambda exc: f"{why} ({exc.__class__.__name__})") as archive:
            raw = bytearray(archive.read(info))  # zipfile checks the record's CRC-32
        if len(raw) != nbytes:  # a stored record reads its compressed size, which may say less than its size
            raise CorruptCheckpointError.at(self._path, f"record {info.filename} gives {len(raw)} bytes, its header "
                                            f"says {nbytes}")
        storage = torch.frombuffer(raw, dtype=getattr(torch, ref.storage.dtype)) if raw else \
            torch.empty(0, dtype=getattr(torch, ref.storage.dtype))
        return torch.as_strided(storage, ref.size, ref.stride, ref.offset).clone()


def _unreadable(ref: _TensorRef) -> Optional[str]:
    """Why a view cannot be read without unbounded work or outside its storage, or None."""
    if any(s == 0 for s in ref.size):
        return None
    last = ref.offset + sum((s - 1) * st for s, st in zip(ref.size, ref.stride))
    if last >= ref.storage.numel:
        return f"a view past the end of its storage ({ref.storage.numel} elements): not read"
    if math.prod(ref.size) > ref.storage.numel:
        return (f"stride-0 (expanded) storage: its {math.prod(ref.size)} elements view {ref.storage.numel} "
                "stored elements; not materialised")
    return None


def _declarations(archive: zipfile.ZipFile, prefix: str) -> dict[str, tuple[set[str], set[str]]]:
    """``__torch__.<module>.<Class>`` -> (its parameters, its buffers), from the archive's code files
    (``<prefix>/code/__torch__/torch/nn/modules/linear.py`` declares ``__torch__.torch.nn.modules.linear.Linear``)."""
    out: dict[str, tuple[set[str], set[str]]] = {}
    folder = f"{prefix}/code/"
    for info in archive.infolist():
        name = info.filename
        if not (name.startswith(folder) and name.endswith(".py")) or info.file_size > _CODE_BYTES:
            continue
        module = name[len(folder):-3].replace("/", ".")
        try:
            text = archive.read(info).decode("utf-8", errors="replace")
        except ZIP_ERRORS:  # a damaged code record: its classes stay undeclared, the tensors are still read
            continue
        for cls, params, buffers in _DECLARED.findall(text):
            out[f"{module}.{cls}"] = (set(re.findall(r'"([^"]*)"', params)), set(re.findall(r'"([^"]*)"', buffers)))
    return out


def _collect(tree: Any, constants: Any, declared: dict[str, tuple[set[str], set[str]]]
             ) -> tuple[list[tuple[str, _TensorRef]], dict[str, str]]:
    """``(dotted name, tensor)`` of every tensor of the module tree in stored order, then the code's
    constants (each container visited once); and, where the code declares its module's class, what
    each is: ``parameter``, ``buffer``, ``attribute`` or ``constant``."""
    out: list[tuple[str, _TensorRef]] = []
    kinds: dict[str, str] = {}
    seen: set[int] = set()
    stack: list[tuple[str, Any, Optional[str]]] = [("", tree, None)]
    while stack:
        prefix, value, kind = stack.pop()
        if isinstance(value, _TensorRef):
            # one dot off, not every trailing one: dict keys "x" and "x." are two names, as a state dict joins them
            out.append((prefix[:-1], value))
            if kind is not None:
                kinds[prefix[:-1]] = kind
            continue
        members = None
        if isinstance(value, _Scripted):
            members = declared.get(type(value).qualname)
            kind = None if members is None else kind  # an undeclared class: what its tensors are is unknown
            value = value.state
        if id(value) in seen or not isinstance(value, (dict, list, tuple)):
            continue
        items = [(str(k), v) for k, v in (value.items() if isinstance(value, dict) else enumerate(value))]
        seen.add(id(value))
        if members is not None:  # a module's own attributes: what its class declares each to be
            params, buffers = members
            stack += [(f"{prefix}{k}.", v, "parameter" if k in params else "buffer" if k in buffers else "attribute")
                      for k, v in reversed(items)]
        else:
            stack += [(f"{prefix}{k}.", v, kind) for k, v in reversed(items)]
    if isinstance(constants, tuple):
        taken = {name for name, _ in out}
        for i, c in enumerate(constants):
            if isinstance(c, _TensorRef):
                # a module attribute "constants" (a ParameterList) names its tensors so too: the later one is
                # qualified by its place, as TFLite's reader qualifies a repeated name
                name = f"constants.{i}" if f"constants.{i}" not in taken else f"constants.{i}#{len(out)}"
                out.append((name, c))
                kinds[name] = "constant"
    return out, kinds


TORCHSCRIPT = register_format(FileFormat(
    name="torchscript", suffixes=(".jit", ".torchscript"), open=TorchScriptSource, sniff=is_torchscript,
    group="more", rank=40))
