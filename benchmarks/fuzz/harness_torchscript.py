"""Fuzz the TorchScript archive reader: one ``model.torchscript`` (read without running its code).

Independent check: the archive's records read with :mod:`zipfile` and its pickles with
:mod:`pickle`, each tensor rebuilt by torch's own ``torch._utils._rebuild_tensor_v2`` on a torch
storage of its record's bytes (``torch.jit.load`` would compile and run the archive's code, and
refuse a fuzzed ``code/`` record the reader never reads); named by the module-tree path as
``wbfe.sources.torchscript_files`` documents it: the reader lists exactly those tensors, and each
tensor read holds the bytes torch rebuilds for it (a view torch refuses is one the reader must
skip). An archive this parse refuses that the reader read is a finding.
"""

from __future__ import annotations

import io
import pickle
import warnings
import zipfile
from collections import OrderedDict
from typing import Any

from benchmarks.fuzz.common import RefusedTensor, check_source, put
from benchmarks.fuzz.harness_safetensors import read_as

NAME = "torchscript"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a TorchScript archive; raise on a finding."""
    path = put("model.torchscript", data)
    check_source(path, reference=lambda: _records_parse(data) if read_as(path, "torchscript") else None)


class _Record:
    """An object of a ``__torch__`` class: its state."""

    def __init__(self, *args: Any) -> None:
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _records_parse(data: bytes) -> dict[str, Any]:
    import torch

    def rebuild(*args: Any) -> Any:
        try:
            return torch._utils._rebuild_tensor_v2(*args)
        except Exception as exc:  # noqa: BLE001 - torch refuses this view: the reader must not read it
            return RefusedTensor(f"{type(exc).__name__}: {exc}")

    def first(value: Any, *rest: Any) -> Any:
        return value

    allowed = {("torch._utils", "_rebuild_tensor_v2"): rebuild, ("torch._utils", "_rebuild_parameter"): first,
               ("collections", "OrderedDict"): OrderedDict, ("torch.jit._pickle", "restore_type_tag"): first,
               **{("torch.jit._pickle", f"build_{k}list"): first for k in ("int", "double", "bool", "tensor")}}

    class Unpickler(pickle.Unpickler):
        def __init__(self, file: Any, archive: zipfile.ZipFile, folder: str):
            super().__init__(file)
            self.archive, self.folder = archive, folder

        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in allowed:
                return allowed[(module, name)]
            if module == "torch" and name.endswith("Storage"):
                return getattr(torch, name)
            if module == "__torch__" or module.startswith("__torch__."):
                return _Record
            raise pickle.UnpicklingError(f"global {module}.{name}")

        def persistent_load(self, pid: Any) -> Any:
            kind, storage_type, key, _location, _numel = pid
            assert kind == "storage", pid
            raw = bytearray(self.archive.read(f"{self.folder}/{key}"))
            dtype = storage_type.dtype
            flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            return torch.storage.TypedStorage(wrap_storage=flat.untyped_storage(), dtype=dtype, _internal=True)

    try:
        with warnings.catch_warnings(), zipfile.ZipFile(io.BytesIO(data)) as archive:
            warnings.simplefilter("ignore")  # TypedStorage's deprecation: it is what the pickle names
            members = archive.namelist()
            prefix = sorted(m.split("/", 1)[0] for m in members if m.count("/") == 1 and m.endswith("/data.pkl"))[0]
            tree = Unpickler(io.BytesIO(archive.read(f"{prefix}/data.pkl")), archive, f"{prefix}/data").load()
            constants = Unpickler(io.BytesIO(archive.read(f"{prefix}/constants.pkl")), archive,
                                  f"{prefix}/constants").load()
    except Exception as exc:  # noqa: BLE001 - any refusal of an archive wbfe read
        raise AssertionError(f"the records' parse refuses an archive the reader read: {type(exc).__name__}: {exc}"
                             ) from None
    out: dict[str, Any] = {}
    seen: set[int] = set()  # a container shared (or nested in itself) by the pickle is named once, where first met
    stack: list[tuple[str, Any]] = [("", tree)]
    while stack:
        prefix_name, value = stack.pop()
        if isinstance(value, (torch.Tensor, RefusedTensor)):
            out[prefix_name.rstrip(".")] = _bytes(torch, value)
            continue
        if isinstance(value, _Record):
            value = value.state
        if id(value) in seen or not isinstance(value, (dict, list, tuple)):
            continue
        seen.add(id(value))
        items = [(str(k), v) for k, v in value.items()] if isinstance(value, dict) else [
            (str(i), v) for i, v in enumerate(value)]
        stack += [(f"{prefix_name}{k}.", v) for k, v in reversed(items)]
    if isinstance(constants, tuple):
        out.update({f"constants.{i}": _bytes(torch, c) for i, c in enumerate(constants)
                    if isinstance(c, (torch.Tensor, RefusedTensor))})
    return out


def _bytes(torch: Any, value: Any) -> Any:
    if isinstance(value, RefusedTensor):
        return value
    flat = value.contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else b""


def seeds() -> dict[str, bytes]:
    """Archives written by ``torch.jit.save`` (a scripted MLP with a constant, a traced CNN, a
    scripted STFT front end whose basis is a buffer)."""
    import torch

    torch.manual_seed(3)

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(6, 10)
            self.fc2 = torch.nn.Linear(10, 3, bias=False)
            self.scale = torch.nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.relu(self.fc1(x))) * self.scale + torch.tensor([1.0, 2.0, 3.0])

    class Stft(torch.nn.Module):  # a Hann-windowed DFT basis buffer, convolved with: skipped by its values
        def __init__(self) -> None:
            super().__init__()
            k, t = torch.arange(5.0)[:, None], torch.arange(8.0)[None]
            window = 0.5 - 0.5 * torch.cos(2 * torch.pi * torch.arange(8.0) / 8)
            angle = 2 * torch.pi * k * t / 8
            self.register_buffer("basis", torch.cat([window * torch.cos(angle), -window * torch.sin(angle)])[:, None])
            self.fc = torch.nn.Linear(10, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # torch's stubs type a registered buffer as Tensor | Module; TorchScript knows it is a Tensor
            return self.fc(torch.nn.functional.conv1d(x, self.basis, stride=4).mean(-1))  # type: ignore[arg-type]

    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 4 * 4, 5)).eval()
    out = {}
    modules = (("mlp.pt", torch.jit.script(Mlp())), ("cnn.pt", torch.jit.trace(cnn, torch.randn(1, 3, 6, 6))),
               ("stft.pt", torch.jit.script(Stft())))
    for name, module in modules:
        buffer = io.BytesIO()
        torch.jit.save(module, buffer)
        out[name] = buffer.getvalue()
    return out
