"""TFLite models (``.tflite``), checked whole when opened; the graph (:mod:`wbfe.sources.tflite_graph`) says which
constants are weights, their layout, order and head; each weight is read alone (one ``pread`` of its buffer) and comes
out in PyTorch's layout, dequantised as TFLite's ``DEQUANTIZE`` computes it (docs/formats.md)."""

from __future__ import annotations

import contextlib
import functools
import math
import mmap
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from wbfe._deps import require
from wbfe.errors import CorruptCheckpointError, UnsupportedDtypeError
from wbfe.framework.description import FrameworkDescription
from wbfe.linalg.arrays import from_bytes
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource, open_regular
from wbfe.sources.io import dequantize, read_range
from wbfe.sources.registry import FileFormat, register_format
from wbfe.sources.tflite_graph import ITEMSIZE, QUANTISED, TORCH_AXES, GraphPlan, Planned, TflBuffer, parse_model, plan_graph

__all__ = ["TfliteSource", "TFLITE", "to_torch_layout", "IDENTIFIER"]

# The file identifier schema.fbs declares (``file_identifier "TFL3"``), at bytes 4..8.
IDENTIFIER = b"TFL3"


class TfliteSource(TensorSource):
    """The constant tensors of a TFLite model, the weights read one at a time in the graph's order."""

    headers_only = True

    def __init__(self, path: Path, ref: str, fmt: Optional[str] = None):
        tflite = require("tflite", "reading TFLite models needs the tflite package: pip install 'wbfe[tflite]'")
        self._path = path
        with open_regular(path) as fh:
            size = fh.seek(0, 2)
            if size < 8:
                raise CorruptCheckpointError.at(path, f"{size} bytes: too short for a TFLite model")
            fh.seek(4)
            identifier = fh.read(4)
            if identifier != IDENTIFIER:
                raise CorruptCheckpointError.at(
                    path, f"not a TFLite model (file identifier {identifier!r}, {IDENTIFIER!r} expected)")
            # Mapped, not read: the flatbuffer of a >2 GB model is followed by its weights.
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                model = parse_model(tflite, buf, size, str(path))
            finally:
                with contextlib.suppress(BufferError):  # a view an error's frames still hold: unmapped when they go
                    buf.close()
        self._buffers = model.buffers
        plan = plan_graph(model)
        for tensor in (planned.tensor for planned in plan.tensors):
            # string, int4, resource...; a sparse tensor's buffer holds only its kept values: never read (a
            # weight of these is skipped with that reason)
            itemsize = ITEMSIZE.get(tensor.dtype, 0.5 if tensor.dtype == "int4" else None)
            needed = math.ceil(math.prod(tensor.shape) * (itemsize or 0))
            if itemsize is not None and not tensor.sparse and model.buffers[tensor.buffer].size != needed:
                raise CorruptCheckpointError.at(
                    path, f"tensor {tensor.name!r}: shape {list(tensor.shape)} of {tensor.dtype} needs {needed} "
                    f"bytes, its buffer {tensor.buffer} holds {model.buffers[tensor.buffer].size}")
        self._plan = plan.tensors
        self.head_hint = plan.head
        self.own_description = _describe(model.description, plan)
        self.provenance = Provenance(source=ref, format="tflite", files=[str(path)], pending=FileDigest([path]),
            extra={"metadata": {"schema_version": model.version, "description": model.description,
                                "subgraphs": len(model.subgraphs),
                                "operators": sum(len(s.ops) for s in model.subgraphs),
                                "external_buffers": sum(1 for b in model.buffers if b.external)},
                   "consumers": {p.name: p.consumers for p in self._plan if p.skip is None}})

    def read(self, planned: Planned) -> Any:
        """The weight as its operator uses it, in PyTorch's layout, dequantised (a torch tensor for bfloat16)."""
        tensor = planned.tensor
        if tensor.sparse or tensor.dtype not in (*ITEMSIZE, "int4"):  # skipped, yet an edit reads it to copy it
            what = "sparse (its buffer holds only the kept values)" if tensor.sparse else (
                f"TFLite type {tensor.dtype} has no numpy dtype")  # string, resource, variant
            raise UnsupportedDtypeError.at(self._path, f"tensor {planned.name!r}: {what}, so it is not read",
                                           name=planned.name, dtype=tensor.dtype)
        buffer: TflBuffer = self._buffers[tensor.buffer]
        raw = read_range(self._path, buffer.start, buffer.size)  # exactly the tensor's bytes
        if tensor.dtype == "int4":  # two a byte, the low nibble first, sign-extended (UnpackDenseInt4IntoInt8)
            nibbles = np.stack([(raw.view(np.int8) << 4) >> 4, raw.view(np.int8) >> 4], axis=-1).reshape(-1)
            array = nibbles[:math.prod(tensor.shape)].reshape(tensor.shape)
        else:  # numpy's little-endian dtype (bfloat16: its bits)
            stored = np.dtype("uint16" if tensor.dtype == "bfloat16" else tensor.dtype).newbyteorder("<")
            array = raw.view(stored).reshape(tensor.shape)
        if tensor.dtype == "bfloat16":  # numpy holds its bits; torch, the values
            bits = np.require(to_torch_layout(array, planned.op or "", planned.transpose), requirements="C")
            return from_bytes(bits.reshape(-1).view(np.uint8), "bfloat16", bits.shape)
        if tensor.quant is not None and tensor.dtype in QUANTISED:
            array = dequantize(array, tensor.quant.scale, tensor.quant.zero_point, tensor.quant.axis)
        elif tensor.dtype == "float16":
            array = array.astype(np.float32)
        return np.array(to_torch_layout(array, planned.op or "", planned.transpose), order="C")

    def __len__(self) -> int:
        return len(self._plan)

    def entries(self) -> Iterator[TensorEntry]:
        for planned in self._plan:
            tensor = planned.tensor
            dtype, quant = tensor.dtype, None
            if planned.skip is None and tensor.dtype in (*QUANTISED, "float16"):
                dtype = "float32"
                per = "" if tensor.quant is None else "-per-channel" if len(tensor.quant.scale) > 1 else "-per-tensor"
                quant = f"tflite-{tensor.dtype}{per}"
            # One buffer read as another shape, type or with other scales is another matrix, not a tied one.
            key = ("tflite-buffer", tensor.buffer, tensor.shape, tensor.dtype, tensor.quant)
            yield TensorEntry(name=planned.name, shape=planned.shape, dtype=dtype, storage_key=key, quant=quant,
                              skip=planned.skip, load=functools.partial(self.read, planned))


def to_torch_layout(t: "np.ndarray", op: str, transpose: bool = False) -> "np.ndarray":
    """A weight of ``op`` as stored (:data:`~wbfe.sources.tflite_graph.STORED_AXES`) in [out, in, k...] (a view)."""
    if op in TORCH_AXES:
        return np.transpose(t, TORCH_AXES[op])
    return t.T if transpose else t


def _describe(model_description: str, plan: GraphPlan) -> FrameworkDescription:
    facts: dict[str, Any] = {"family": "tflite", "dropout_unrecorded": (
        "an inference graph: the converter removes dropout, so whether training put dropout before the head "
        "is not recorded")}
    if plan.head is not None:
        facts["head_class"] = "FULLY_CONNECTED"
    note = plan.note or "an inference graph: the converter drops dropout, so whether training used it is unknown"
    weights = tuple(p.name for p in plan.tensors if p.skip is None)
    return FrameworkDescription("tflite", model_description or "tflite", weights, plan.head, note=note, facts=facts)


TFLITE = register_format(FileFormat(name="tflite", suffixes=(".tflite",), open=TfliteSource, group="other", rank=30,
                                    sniff=lambda head, path: len(head) >= 8 and head[4:8] == IDENTIFIER))
