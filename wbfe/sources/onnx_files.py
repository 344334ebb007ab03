"""ONNX models (``.onnx``, with or without external data files), parsed by the ``onnx`` package without their
external data, which is read one tensor at a time; which stored tensors are weights, their orientation, order and
head come from the graph (:mod:`wbfe.sources.onnx_graph`)."""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from wbfe._deps import require
from wbfe.errors import CorruptCheckpointError, SourceNotFoundError, TruncatedCheckpointError, WbfeError
from wbfe.linalg.arrays import is_known_dtype
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource
from wbfe.sources.io import dequantize, read_range
from wbfe.sources.onnx_graph import Planned, Stored, plan_graph
from wbfe.sources.registry import FileFormat, register_format

__all__ = ["OnnxSource", "ONNX"]


class OnnxSource(TensorSource):
    """The weights an ONNX model's graph stores, read one at a time in the model's order."""

    def __init__(self, path: Path, ref: str, fmt: Optional[str] = None):
        onnx = self._onnx = require("onnx", "reading ONNX models needs the onnx package: pip install 'wbfe[onnx]'")
        self._path = path
        self._base = path.parent.resolve()
        from google.protobuf.message import DecodeError  # onnx's own dependency
        try:
            model = onnx.load(str(path), load_external_data=False)
        except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError.at(path, "not a readable ONNX model (truncated or corrupt protobuf: "
                                            f"{str(exc)[:120]})") from None
        graph = model.graph
        if model.ir_version <= 0 or not graph.node:
            raise CorruptCheckpointError.at(path, "not an ONNX model (no graph nodes)")
        try:
            plan = plan_graph(onnx, graph, functools.partial(_dtype_name, onnx), values=self.read)
        except WbfeError:  # a weight read to see what it is (a DFT basis), and found damaged, says so itself
            raise
        except (ValueError, TypeError, KeyError) as exc:  # a malformed attribute or tensor header
            raise CorruptCheckpointError.at(path, f"malformed ONNX graph ({str(exc)[:120]})") from None
        if not all(isinstance(w.name, str) for w in plan.tensors):  # proto2 strings: UTF-8 is not checked
            raise CorruptCheckpointError.at(path, "malformed ONNX graph (a tensor name that is not UTF-8 text)")
        names = [w.name for w in plan.tensors]
        if len(set(names)) != len(names):  # ONNX values are single-assignment: which one would the graph use?
            twice = next(n for n in names if names.count(n) > 1)
            raise CorruptCheckpointError.at(path, f"malformed ONNX graph (two stored tensors named {twice[:200]!r})")
        self._weights = plan.tensors
        self._stored = plan.stored
        self._files = self._check_data(onnx)
        self.head_hint = plan.head
        metadata = {"producer": f"{model.producer_name} {model.producer_version}".strip(),
                    "ir_version": int(model.ir_version),
                    "opset": {o.domain or "ai.onnx": int(o.version) for o in model.opset_import}}
        consumers = {w.name: w.consumers for w in self._weights if w.consumers and w.skip is None}
        self.provenance = Provenance(source=ref, format="onnx-external-data" if len(self._files) > 1 else "onnx",
            files=[str(p) for p in self._files], pending=FileDigest(self._files),
            extra={"metadata": metadata, "consumers": consumers})

    def _check_data(self, onnx: Any) -> list[Path]:
        """The external data files, each inside the model's folder and long enough for its tensors."""
        files = [self._path]
        for weight in self._weights:
            tensor = weight.stored.tensor
            if tensor is not None and onnx.external_data_helper.uses_external_data(tensor):
                file = self._external_info(tensor)[0]
                if file not in files:
                    files.append(file)
            elif tensor is not None and weight.skip is None and not tensor.raw_data and _numel(tensor) and not any(
                    getattr(tensor, f"{k}_data") for k in ("float", "int32", "int64", "double", "uint64", "string")):
                raise CorruptCheckpointError.at(self._path, f"initializer {weight.name!r} has no data")
            if weight.skip is None:  # the weight's data and its DequantizeLinear's, all read when it is scored
                for vid in (weight.stored.vid, *(weight.dq[:2] if weight.dq is not None else ())):
                    if vid in self._stored:
                        self._check_inline(self._stored[vid])
        return files

    def _check_inline(self, stored: Stored) -> None:
        """Refuse an inline tensor whose data is not the size its shape and data type need (numpy would refuse to
        shape it only when it is read, after other weights were scored)."""
        tensor = stored.tensor
        if tensor is None or self._onnx.external_data_helper.uses_external_data(tensor):
            return
        found = _inline_size(self._onnx, tensor)
        if found is not None and found[0] != found[1]:
            have, need, unit = found
            raise CorruptCheckpointError.at(
                self._path, f"initializer {stored.name[:200]!r} holds {have} {unit} of data, its shape "
                f"{list(tensor.dims)} of {_dtype_name(self._onnx, tensor.data_type)} needs {need}: a damaged model; "
                "export it again")

    def _external_info(self, tensor: Any) -> tuple[Path, int, int]:
        """The file, offset and length of an external tensor's data, checked."""
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        parts = [p for p in location.replace(os.sep, "/").split("/") if p not in ("", ".")]
        # As a shard index's names: folders of the model's own (no '..', no symlinked folder), the file itself may
        # be a symlink (a hub cache's snapshot links every file to its blob, outside the snapshot's folder).
        folders = [self._base.joinpath(*parts[:i]) for i in range(1, len(parts))]
        if not parts or os.path.isabs(location) or ".." in parts or any(f.is_symlink() for f in folders):
            raise CorruptCheckpointError.at(
                self._path, f"external data of {tensor.name!r} at {location!r} lies outside the model's folder")
        target = self._base.joinpath(*parts)
        if not target.is_file():
            raise SourceNotFoundError.at(self._path, f"external data file {location!r} of {tensor.name!r} is missing")
        need = _raw_size(self._onnx, tensor)
        if need is None:  # a type code onnx does not know (a KeyError went out), or STRING, never stored outside
            raise CorruptCheckpointError.at(self._path, f"initializer {tensor.name!r} of data type {tensor.data_type} "
                                            "in external data: a type whose bytes wbfe cannot lay out")
        try:
            offset = int(entries.get("offset", 0) or 0)
            length = int(entries["length"]) if entries.get("length") else need
        except ValueError:  # int()'s error went out as a traceback
            raise CorruptCheckpointError.at(self._path, f"external data of {tensor.name!r}: an offset or length that is "
                                            f"not a whole number ({entries.get('offset')!r}, {entries.get('length')!r})"
                                            ) from None
        size = target.stat().st_size
        if offset < 0 or length != need or offset + length > size:
            raise TruncatedCheckpointError.at(
                self._path, f"data of {tensor.name!r} out of range in {location} (bytes {offset}..{offset + length} "
                f"of a {size}-byte file, {need} needed)")
        return target, offset, length

    def _stored_array(self, stored: Stored) -> "np.ndarray":
        onnx = self._onnx
        if stored.array is not None:
            return stored.array
        tensor, name = stored.tensor, stored.name
        self._check_inline(stored)  # a weight the graph's rules read while the model is opened is not checked yet
        try:
            if onnx.external_data_helper.uses_external_data(tensor):
                raw = read_range(*self._external_info(tensor))  # which checks the data type too
                if onnx.TensorProto.DataType.Name(tensor.data_type) in _PACKED_BITS:  # two or more values a byte
                    inline = onnx.TensorProto()
                    inline.CopyFrom(tensor)
                    del inline.external_data[:]
                    inline.data_location, inline.raw_data = onnx.TensorProto.DEFAULT, raw.tobytes()
                    return onnx.numpy_helper.to_array(inline)
                return raw.view(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).reshape(tuple(tensor.dims))
            return onnx.numpy_helper.to_array(tensor)
        except WbfeError:  # the external data's own errors (missing, out of range, cut short)
            raise
        except KeyError as exc:  # a data type code onnx does not know (a scale's, say: found by fuzzing)
            raise CorruptCheckpointError.at(self._path,
                                            f"initializer {name!r} has an unknown data type {exc}") from None
        except (ValueError, TypeError) as exc:
            raise CorruptCheckpointError.at(self._path, f"initializer {name!r} unreadable ({exc})") from None

    def read(self, weight: Planned) -> Any:
        """The tensor as the consuming operator uses it (dequantised, out × in)."""
        array = self._stored_array(weight.stored)
        if weight.dq is not None:
            try:
                scale = self._stored_array(self._stored[weight.dq[0]])
                zero = None if weight.dq[1] is None else self._stored_array(self._stored[weight.dq[1]])
                array = dequantize(array, scale, zero, weight.dq[2], weight.dq[3])
            except ValueError as exc:  # a scale or zero point that does not fit the tensor (found by fuzzing)
                raise CorruptCheckpointError.at(self._path, f"DequantizeLinear of {weight.name!r}: {exc}") from None
        if weight.index is not None:  # one direction of a recurrent operand [directions, gates·hidden, in]
            array = array[weight.index]
        # A C-ordered copy the tensor owns, writable; not np.ascontiguousarray, which makes a 0-D
        # constant (a value_float) 1-D, unlike the shape its entry lists.
        return np.array(array.T if weight.transpose else array, order="C")

    def __len__(self) -> int:
        return len(self._weights)

    def entries(self) -> Iterator[TensorEntry]:
        for weight in self._weights:
            skip = weight.skip
            if skip is None and not is_known_dtype(weight.dtype):
                # an ONNX data type wbfe holds no tensors of (a string, an unknown code): never read
                skip = f"{weight.dtype} tensor: not a dtype wbfe reads as a weight"
            yield TensorEntry(name=weight.name, shape=weight.shape, dtype=weight.dtype,
                              load=functools.partial(self.read, weight), quant=weight.quant, skip=skip,
                              layout=weight.layout)


def _numel(tensor: Any) -> int:
    return math.prod(int(d) for d in tensor.dims)


# Bits of an element of the ONNX data types packed below a byte (raw_data and, but for 6 bits, int32_data).
_PACKED_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2, "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}


def _type_name(onnx: Any, tensor: Any) -> Optional[str]:
    """The tensor's ONNX data type name; None for a code onnx does not know, STRING and UNDEFINED (no raw bytes)."""
    known = tensor.data_type in onnx.TensorProto.DataType.values()
    name = onnx.TensorProto.DataType.Name(tensor.data_type) if known else None
    return None if name in ("STRING", "UNDEFINED") else name


def _raw_size(onnx: Any, tensor: Any) -> Optional[int]:
    """The bytes of a tensor's ``raw_data`` or external data (packed below a byte for the 2-, 4- and 6-bit types);
    None where wbfe does not know what the type needs."""
    name = _type_name(onnx, tensor)
    if name is None:
        return None
    if name in _PACKED_BITS:
        return -(-_numel(tensor) * _PACKED_BITS[name] // 8)
    try:
        return _numel(tensor) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def _inline_size(onnx: Any, tensor: Any) -> Optional[tuple[int, int, str]]:
    """``(held, needed, unit)`` of an inline tensor's data: bytes of ``raw_data``, else values of its typed field (the
    layouts of ``onnx.numpy_helper.to_array``); None where wbfe does not know what the type needs."""
    if tensor.HasField("raw_data"):
        need = _raw_size(onnx, tensor)
        return None if need is None else (len(tensor.raw_data), need, "bytes")
    name = _type_name(onnx, tensor)
    if name is None or _PACKED_BITS.get(name, 6) != 6:
        return None  # packed into int32_data as into raw_data, but the layout has changed between onnx versions
    try:
        values = getattr(tensor, onnx.helper.tensor_dtype_to_field(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    return len(values), _numel(tensor) * (2 if name.startswith("COMPLEX") else 1), "values"


def _dtype_name(onnx: Any, data_type: int) -> str:
    if data_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(data_type))
    except (KeyError, ValueError, TypeError):
        return f"onnx-type-{data_type}"


ONNX = register_format(FileFormat(name="onnx", suffixes=(".onnx",), open=OnnxSource, group="other", rank=30))
