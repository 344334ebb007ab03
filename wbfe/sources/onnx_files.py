"""ONNX models (``.onnx``, with or without external data files), parsed by the ``onnx`` package.

The weight matrices are the initializers a node takes as its weight: input B of ``MatMul`` (stored
in × out: reported out × in) and of ``Gemm`` (out × in when ``transB`` is set, else in × out), input W
of ``Conv`` (out × in/groups × k…) and ``ConvTranspose`` (in × out/groups × k…, as PyTorch holds
both), and the table of a ``Gather`` (an embedding). ``Identity`` and 2-D ``Transpose`` nodes between
an initializer and its consumer are followed. A quantised initializer reaching one of these through
``DequantizeLinear`` is dequantised, ``(q − zero point)·scale`` per tensor, axis or block, in float32
as the operator computes it. Every other initializer is listed as skipped with its consumer named.
The model is parsed without its external data, which is read one tensor at a time when asked for.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

from wbfe.errors import CorruptCheckpointError, MissingDependencyError, SourceNotFoundError, TruncatedCheckpointError
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource
from wbfe.sources.io import read_range
from wbfe.sources.registry import FileFormat, register_format

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["OnnxSource", "open_onnx", "ONNX"]

# Weight input of each operator: (input index, layout of the stored tensor).
_WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Conv": 1, "ConvTranspose": 1, "Gather": 0}
_PASS_THROUGH = ("Identity", "Transpose")


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise MissingDependencyError("reading ONNX models needs the onnx package: pip install 'wbfe[onnx]'",
                                     package="onnx") from None
    return onnx


@dataclass
class _Weight:
    """An initializer and what the graph does with it."""

    name: str
    shape: tuple[int, ...]  # reported
    dtype: str
    transpose: bool = False
    quant: Optional[str] = None
    skip: Optional[str] = None
    consumers: list[str] = field(default_factory=list)
    dq: Optional[tuple[str, Optional[str], int, int]] = None  # (scale, zero point, axis, block size)


class OnnxSource(TensorSource):
    """The weight initializers of an ONNX model, read one at a time."""

    def __init__(self, ref: str, path: Path):
        onnx = _onnx()
        self._path = path
        self._base = path.parent.resolve()
        from google.protobuf.message import DecodeError  # onnx's own dependency
        try:
            model = onnx.load(str(path), load_external_data=False)
        except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError(
                f"{path}: not a readable ONNX model (truncated or corrupt protobuf: {str(exc)[:120]})", path=str(path)
            ) from None
        graph = model.graph
        if model.ir_version <= 0 or not graph.node:
            raise CorruptCheckpointError(f"{path}: not an ONNX model (no graph nodes)", path=str(path))
        self._init = {t.name: t for t in graph.initializer}
        self._weights = self._plan(onnx, graph)
        self._files = self._check_data(onnx)
        self.head_hint = self._head(graph)
        metadata = {"producer": f"{model.producer_name} {model.producer_version}".strip(),
                    "ir_version": int(model.ir_version),
                    "opset": {o.domain or "ai.onnx": int(o.version) for o in model.opset_import}}
        consumers = {w.name: w.consumers for w in self._weights if w.consumers and w.skip is None}
        self.provenance = Provenance(
            source=ref, format="onnx-external-data" if len(self._files) > 1 else "onnx",
            files=[str(p) for p in self._files], pending=FileDigest(self._files),
            extra={"metadata": metadata, "consumers": consumers},
        )

    # ---- the graph -----------------------------------------------------------------------------

    def _plan(self, onnx: Any, graph: Any) -> list[_Weight]:
        from onnx import helper

        uses: dict[str, list[tuple[Any, int]]] = defaultdict(list)
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name:
                    uses[name].append((node, i))
        weights: dict[str, _Weight] = {}
        for name, tensor in self._init.items():
            dims = tuple(int(d) for d in tensor.dims)
            weights[name] = _Weight(name, dims, _dtype_name(onnx, tensor.data_type))

        def final_uses(value: str, transposed: bool) -> list[tuple[Any, int, bool]]:
            """The nodes a value reaches through Identity / 2-D Transpose nodes (and whether transposed)."""
            out = []
            for node, i in uses.get(value, []):
                if node.op_type in _PASS_THROUGH and i == 0:
                    perm = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "perm"), None)
                    if node.op_type == "Identity" or list(perm or [1, 0]) == [1, 0]:
                        out += final_uses(node.output[0], transposed ^ (node.op_type == "Transpose"))
                        continue
                out.append((node, i, transposed))
            return out

        for name, weight in weights.items():
            found = final_uses(name, False)
            dq = [(n, i) for n, i, _ in found if n.op_type == "DequantizeLinear" and i == 0]
            if dq:
                node = dq[0][0]
                scale = node.input[1] if len(node.input) > 1 else ""
                zero = node.input[2] if len(node.input) > 2 and node.input[2] else None
                if scale not in self._init or (zero is not None and zero not in self._init):
                    weight.skip = "quantised weight whose DequantizeLinear scale is not an initializer"
                    continue
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                weight.dq = (scale, zero, int(attrs.get("axis", 1)), int(attrs.get("block_size", 0)))
                weight.quant = f"onnx-{weight.dtype}"
                weights[scale].skip = f"consumed: scale of quantised weight {name} ({_node_name(node)})"
                if zero is not None:
                    weights[zero].skip = f"consumed: zero point of quantised weight {name} ({_node_name(node)})"
                found = final_uses(node.output[0], any(t for n, _, t in found if n is node))
            weight_uses = [(n, i, t) for n, i, t in found if _WEIGHT_INPUT.get(n.op_type) == i]
            if weight.skip is not None:
                continue
            if not weight_uses:
                if found:
                    what = ", ".join(f"{_node_name(n)} input {i}" for n, i, _ in found[:3])
                    bias = any(n.op_type in ("Gemm", "Conv", "ConvTranspose") and i == 2 for n, i, _ in found)
                    weight.skip = ("bias" if bias else "not a weight input") + f" (consumed by {what})"
                else:
                    weight.skip = "initializer no node uses as a weight (graph input default or unused)"
                continue
            node, _, transposed = weight_uses[-1]
            weight.consumers = [_node_name(n) for n, _, _ in weight_uses]
            if node.op_type in ("MatMul", "Gemm") and len(weight.shape) != 2:
                weight.skip = f"{len(weight.shape)}-D {node.op_type} operand (batched weights are not read)"
                continue
            if node.op_type == "Gemm":
                trans_b = any(a.name == "transB" and helper.get_attribute_value(a) for a in node.attribute)
                transposed ^= not trans_b
            elif node.op_type == "MatMul":
                transposed = not transposed
            weight.transpose = transposed
            if transposed:
                weight.shape = (weight.shape[1], weight.shape[0])
            if weight.quant is not None:
                weight.dtype = "float32"
        return list(weights.values())

    def _head(self, graph: Any) -> Optional[str]:
        """The weight of the last Gemm/MatMul the graph's first output depends on."""
        if not graph.output:
            return None
        producer = {out: node for node in graph.node for out in node.output}
        order = {id(node): i for i, node in enumerate(graph.node)}
        by_consumer = {c: w.name for w in self._weights if w.skip is None for c in w.consumers}
        seen: set[int] = set()
        stack = [graph.output[0].name]
        best: tuple[int, str] | None = None
        while stack:
            node = producer.get(stack.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            name = _node_name(node)
            if node.op_type in ("Gemm", "MatMul") and name in by_consumer:
                if best is None or order[id(node)] > best[0]:
                    best = (order[id(node)], by_consumer[name])
            stack += [i for i in node.input if i]
        return best[1] if best else None

    # ---- the data ------------------------------------------------------------------------------

    def _check_data(self, onnx: Any) -> list[Path]:
        """The external data files, each inside the model's folder and long enough for its tensors."""
        files = [self._path]
        for weight in self._weights:
            tensor = self._init[weight.name]
            if _external(onnx, tensor):
                info = self._external_info(tensor)
                if info["file"] not in files:
                    files.append(info["file"])
                continue
            if weight.skip is None or weight.quant is not None:
                if not tensor.raw_data and not _typed_count(tensor) and _numel(tensor) and weight.skip is None:
                    raise CorruptCheckpointError(f"{self._path}: initializer {weight.name!r} has no data",
                                                 path=str(self._path))
        return files

    def _external_info(self, tensor: Any) -> dict[str, Any]:
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        target = (self._base / location).resolve()
        if not location or os.path.isabs(location) or not target.is_relative_to(self._base):
            raise CorruptCheckpointError(
                f"{self._path}: external data of {tensor.name!r} at {location!r} lies outside the model's folder",
                path=str(self._path),
            )
        if not target.is_file():
            raise SourceNotFoundError(f"{self._path}: external data file {location!r} of {tensor.name!r} is missing",
                                      path=str(self._path))
        offset = int(entries.get("offset", 0) or 0)
        itemsize = _itemsize(tensor.data_type)
        length = int(entries["length"]) if entries.get("length") else _numel(tensor) * itemsize
        size = target.stat().st_size
        if offset < 0 or length != _numel(tensor) * itemsize or offset + length > size:
            raise TruncatedCheckpointError(
                f"{self._path}: data of {tensor.name!r} out of range in {location} "
                f"(bytes {offset}..{offset + length} of a {size}-byte file, {_numel(tensor) * itemsize} needed)",
                path=str(self._path),
            )
        return {"file": target, "offset": offset, "length": length}

    def _array(self, name: str) -> "np.ndarray":
        import numpy as np
        from onnx import numpy_helper

        onnx = _onnx()
        tensor = self._init[name]
        if _external(onnx, tensor):
            info = self._external_info(tensor)
            raw = read_range(info["file"], info["offset"], info["length"])
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
            return raw.view(dtype).reshape(tuple(tensor.dims))
        try:
            return numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as exc:
            raise CorruptCheckpointError(f"{self._path}: initializer {name!r} unreadable ({exc})",
                                         path=str(self._path)) from None

    def read(self, weight: _Weight) -> "torch.Tensor":
        import numpy as np
        import torch

        array = self._array(weight.name)
        if weight.dq is not None:
            array = _dequantize(array, self._array(weight.dq[0]),
                                None if weight.dq[1] is None else self._array(weight.dq[1]), weight.dq[2], weight.dq[3])
        t = torch.from_numpy(np.array(array))  # a copy the tensor owns, writable
        return (t.T if weight.transpose else t).contiguous()

    def __len__(self) -> int:
        return len(self._weights)

    def entries(self) -> Iterator[TensorEntry]:
        for weight in self._weights:
            load = _Loader(self, weight)
            yield TensorEntry(name=weight.name, shape=weight.shape, dtype=weight.dtype, load=load, reread=load,
                              quant=weight.quant, skip=weight.skip)


class _Loader:
    def __init__(self, source: OnnxSource, weight: _Weight):
        self.source, self.weight = source, weight

    def __call__(self) -> "torch.Tensor":
        return self.source.read(self.weight)


def _dequantize(q: "np.ndarray", scale: "np.ndarray", zero: "Optional[np.ndarray]", axis: int, block: int) -> "np.ndarray":
    """DequantizeLinear: ``(q − zero)·scale`` in float32, the scale per tensor, along ``axis``, or per
    block of ``block`` elements along ``axis``."""
    import numpy as np

    x = q.astype(np.int32)
    scale = scale.astype(np.float32)
    zero_i = zero.astype(np.int32) if zero is not None else np.zeros_like(scale, dtype=np.int32)
    if scale.ndim > 0 and scale.size > 1 or block:
        axis = axis % q.ndim
        if block:
            scale = np.repeat(scale, block, axis=axis).take(range(q.shape[axis]), axis=axis)
            zero_i = np.repeat(zero_i, block, axis=axis).take(range(q.shape[axis]), axis=axis)
        else:
            shape = [1] * q.ndim
            shape[axis] = -1
            scale, zero_i = scale.reshape(shape), zero_i.reshape(shape)
    return ((x - zero_i).astype(np.float32) * scale).astype(np.float32)


def _node_name(node: Any) -> str:
    return f"{node.name or node.output[0]} ({node.op_type})"


def _external(onnx: Any, tensor: Any) -> bool:
    return bool(tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL)


def _numel(tensor: Any) -> int:
    n = 1
    for d in tensor.dims:
        n *= int(d)
    return n


def _typed_count(tensor: Any) -> int:
    return sum(len(getattr(tensor, f)) for f in ("float_data", "int32_data", "int64_data", "double_data",
                                                  "uint64_data", "string_data"))


def _itemsize(data_type: int) -> int:
    import numpy as np

    onnx = _onnx()
    return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize)


def _dtype_name(onnx: Any, data_type: int) -> str:
    try:
        name = str(onnx.helper.tensor_dtype_to_np_dtype(data_type))
    except (KeyError, ValueError, TypeError):
        return f"onnx-type-{data_type}"
    if data_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"
    return name


def open_onnx(path: Path, ref: str, fmt: str | None = None) -> OnnxSource:
    """Open an ONNX model (a protobuf, with no magic: told by its ``.onnx`` suffix).

    Raises:
        CorruptCheckpointError, TruncatedCheckpointError, SourceNotFoundError, MissingDependencyError:
            as the reader raises.
    """
    return OnnxSource(ref, path)


ONNX = register_format(FileFormat(name="onnx", suffixes=(".onnx",), open=open_onnx, group="other", rank=30))
