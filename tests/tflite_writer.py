"""A small TFLite writer for the tests, built with ``flatbuffers.Builder`` field by field from
TensorFlow Lite's ``schema.fbs`` (schema version 3): no converter is available here.

Field slots are the schema's field ids (a table's n-th field is slot n, vtable offset 4 + 2n):

- Model: version 0, operator_codes 1, subgraphs 2, description 3, buffers 4.
- OperatorCode: deprecated_builtin_code 0 (byte), custom_code 1, version 2, builtin_code 3 (int).
- SubGraph: tensors 0, inputs 1, outputs 2, operators 3, name 4.
- Tensor: shape 0, type 1 (byte), buffer 2 (uint), name 3, quantization 4, is_variable 5,
  sparsity 6.
- QuantizationParameters: min 0, max 1, scale 2 ([float]), zero_point 3 ([long]), details_type 4,
  details 5, quantized_dimension 6.
- Operator: opcode_index 0, inputs 1, outputs 2, builtin_options_type 3, builtin_options 4.
- Buffer: data 0 ([ubyte], force_align 16), offset 1 (ulong), size 2 (ulong).
- FullyConnectedOptions: weights_format 1. BatchMatMulOptions: adj_x 0, adj_y 1.

The file identifier ``TFL3`` goes at bytes 4..8 (``Finish(..., file_identifier)``). With
``external=True`` the buffers' bytes go after the flatbuffer, each 16-byte aligned, found through
``Buffer.offset``/``size`` as a >2 GB model stores them.

:func:`twin_models` builds the models the tests use from float weights: the float32 model, its int8
per-channel twin, a uint8 per-tensor variant, an int16 variant and a float16 + ``DEQUANTIZE`` one,
each quantised the way TFLite's converter quantises weights (symmetric per channel along the output
channel: scale = max|w|/qmax, zero point 0; asymmetric per tensor for uint8).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import flatbuffers
import numpy as np

# TensorType codes and BuiltinOperator codes (schema.fbs).
FLOAT32, FLOAT16, INT32, UINT8, INT16, INT8 = 0, 1, 2, 3, 7, 9
CONV_2D, DEPTHWISE_CONV_2D, DEQUANTIZE, FULLY_CONNECTED, RESHAPE, SOFTMAX = 3, 4, 6, 9, 22, 25
BATCH_MATMUL, DENSIFY = 126, 124
_FC_OPTIONS, _BMM_OPTIONS = 8, 101
_NUMPY = {FLOAT32: "<f4", FLOAT16: "<f2", INT32: "<i4", UINT8: "u1", INT16: "<i2", INT8: "i1"}


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    type: int = FLOAT32
    data: Optional[bytes] = None  # None: an activation (buffer 0, the empty sentinel)
    scale: Sequence[float] = ()
    zero_point: Sequence[int] = ()
    axis: int = 0
    buffer: Optional[int] = None  # overrides the buffer index (to write a broken file)
    sparse: bool = False  # a SparsityParameters table (empty: its buffer holds only kept values)


@dataclass
class Op:
    code: int
    inputs: Sequence[int]
    outputs: Sequence[int]
    weights_format: Optional[int] = None  # FULLY_CONNECTED options
    adj_y: Optional[bool] = None  # BATCH_MATMUL options


@dataclass
class Graph:
    tensors: list[Tensor] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def add(self, tensor: Tensor) -> int:
        self.tensors.append(tensor)
        return len(self.tensors) - 1


def _ints(b: flatbuffers.Builder, values: Sequence[int], width: int = 4) -> int:
    return b.CreateNumpyVector(np.asarray(values, dtype="<i4" if width == 4 else "<i8"))


def _table_vector(b: flatbuffers.Builder, offsets: Sequence[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _bytes(b: flatbuffers.Builder, data: bytes) -> int:
    b.StartVector(1, len(data), 16)  # force_align: 16
    b.head = b.head - len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    b.vectorNumElems = len(data)
    return b.EndVector()


def build(graph: Graph, *, external_at: Optional[list[int]] = None, description: str = "wbfe test model",
          identifier: bytes = b"TFL3") -> bytes:
    """The flatbuffer of ``graph``; ``external_at``: each constant's file offset (its data then left
    out of the flatbuffer, to be appended by :func:`write`)."""
    b = flatbuffers.Builder(1024)
    datas = [t.data for t in graph.tensors if t.data is not None]
    buffer_offs = []
    # Buffer 0: the empty sentinel every activation points at.
    b.StartObject(3)
    buffer_offs.append(b.EndObject())
    for k, data in enumerate(datas):
        vec = None if external_at is not None else _bytes(b, data)
        b.StartObject(3)
        if vec is not None:
            b.PrependUOffsetTRelativeSlot(0, vec, 0)
        else:
            b.PrependUint64Slot(1, external_at[k], 0)  # type: ignore[index]
            b.PrependUint64Slot(2, len(data), 0)
        buffer_offs.append(b.EndObject())
    codes = sorted({op.code for op in graph.ops})
    code_offs = []
    for code in codes:
        b.StartObject(4)
        b.PrependInt8Slot(0, min(code, 127), 0)
        b.PrependInt32Slot(2, 1, 1)
        b.PrependInt32Slot(3, code, 0)
        code_offs.append(b.EndObject())
    tensor_offs = []
    buffer = 0
    for t in graph.tensors:
        name = b.CreateString(t.name)
        shape = _ints(b, t.shape)
        quant = None
        if t.scale:
            scale = b.CreateNumpyVector(np.asarray(t.scale, dtype="<f4"))
            zero = _ints(b, t.zero_point, 8)
            b.StartObject(7)
            b.PrependUOffsetTRelativeSlot(2, scale, 0)
            b.PrependUOffsetTRelativeSlot(3, zero, 0)
            b.PrependInt32Slot(6, t.axis, 0)
            quant = b.EndObject()
        sparsity = None
        if t.sparse:
            b.StartObject(3)
            sparsity = b.EndObject()
        if t.data is not None:
            buffer += 1
        b.StartObject(9)
        b.PrependUOffsetTRelativeSlot(0, shape, 0)
        b.PrependInt8Slot(1, t.type, 0)
        b.PrependUint32Slot(2, t.buffer if t.buffer is not None else buffer if t.data is not None else 0, 0)
        b.PrependUOffsetTRelativeSlot(3, name, 0)
        if quant is not None:
            b.PrependUOffsetTRelativeSlot(4, quant, 0)
        if sparsity is not None:
            b.PrependUOffsetTRelativeSlot(6, sparsity, 0)
        tensor_offs.append(b.EndObject())
    op_offs = []
    for op in graph.ops:
        ins, outs = _ints(b, op.inputs), _ints(b, op.outputs)
        options, kind = None, 0
        if op.weights_format is not None:
            b.StartObject(5)
            b.PrependInt8Slot(1, op.weights_format, 0)
            options, kind = b.EndObject(), _FC_OPTIONS
        elif op.adj_y is not None:
            b.StartObject(3)
            b.PrependBoolSlot(1, op.adj_y, False)
            options, kind = b.EndObject(), _BMM_OPTIONS
        b.StartObject(13)
        b.PrependUint32Slot(0, codes.index(op.code), 0)
        b.PrependUOffsetTRelativeSlot(1, ins, 0)
        b.PrependUOffsetTRelativeSlot(2, outs, 0)
        if options is not None:
            b.PrependUint8Slot(3, kind, 0)
            b.PrependUOffsetTRelativeSlot(4, options, 0)
        op_offs.append(b.EndObject())
    tensors, operators = _table_vector(b, tensor_offs), _table_vector(b, op_offs)
    inputs, outputs = _ints(b, graph.inputs), _ints(b, graph.outputs)
    sg_name = b.CreateString("main")
    b.StartObject(5)
    b.PrependUOffsetTRelativeSlot(0, tensors, 0)
    b.PrependUOffsetTRelativeSlot(1, inputs, 0)
    b.PrependUOffsetTRelativeSlot(2, outputs, 0)
    b.PrependUOffsetTRelativeSlot(3, operators, 0)
    b.PrependUOffsetTRelativeSlot(4, sg_name, 0)
    subgraph = b.EndObject()
    subgraphs = _table_vector(b, [subgraph])
    opcodes = _table_vector(b, code_offs)
    buffers = _table_vector(b, buffer_offs)
    desc = b.CreateString(description)
    b.StartObject(8)
    b.PrependUint32Slot(0, 3, 0)
    b.PrependUOffsetTRelativeSlot(1, opcodes, 0)
    b.PrependUOffsetTRelativeSlot(2, subgraphs, 0)
    b.PrependUOffsetTRelativeSlot(3, desc, 0)
    b.PrependUOffsetTRelativeSlot(4, buffers, 0)
    model = b.EndObject()
    b.Finish(model, file_identifier=identifier)
    return bytes(b.Output())


def write(path: Path, graph: Graph, *, external: bool = False, identifier: bytes = b"TFL3") -> Path:
    """Write ``graph`` to ``path``; ``external``: weights in the trailing area (Buffer.offset/size)."""
    if not external:
        path.write_bytes(build(graph, identifier=identifier))
        return path
    datas = [t.data for t in graph.tensors if t.data is not None]
    # Offsets are fixed-width fields: a first pass with placeholders gives the flatbuffer's size.
    size = len(build(graph, external_at=[2] * len(datas), identifier=identifier))
    offsets, at = [], (size + 15) // 16 * 16
    for data in datas:
        offsets.append(at)
        at = (at + len(data) + 15) // 16 * 16  # type: ignore[arg-type]
    flat = build(graph, external_at=offsets, identifier=identifier)
    assert len(flat) == size
    out = bytearray(flat)
    for offset, data in zip(offsets, datas):
        out += b"\0" * (offset - len(out)) + data  # type: ignore[operator]
    path.write_bytes(bytes(out))
    return path


# ---- quantisation as TFLite's converter does it ------------------------------------------------


def quantize_symmetric(w: np.ndarray, axis: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel symmetric quantisation along ``axis``: (q, scales), zero points 0."""
    qmax = 2 ** (bits - 1) - 1
    other = tuple(i for i in range(w.ndim) if i != axis)
    scale = (np.abs(w).max(axis=other) / qmax).astype(np.float32)  # stored as float32
    shape = [1] * w.ndim
    shape[axis] = -1
    # rounded in float64 against the stored scale: within half a step of it, whatever the bits
    q = np.clip(np.round(w.astype(np.float64) / scale.reshape(shape).astype(np.float64)), -qmax, qmax)
    return q.astype(np.int8 if bits == 8 else np.int16), scale


def quantize_uint8(w: np.ndarray) -> tuple[np.ndarray, float, int]:
    """Per-tensor asymmetric uint8: (q, scale, zero point), the range widened to hold 0."""
    lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
    scale = float(np.float32((hi - lo) / 255.0))  # stored as float32
    zero = int(np.clip(np.round(-lo / scale), 0, 255))
    q = np.clip(np.round(w.astype(np.float64) / scale) + zero, 0, 255).astype(np.uint8)
    return q, scale, zero


# Per-channel axis of each weight as TFLite stores it (schema.fbs: the output channel).
AXES = {"conv": 0, "depthwise": 3, "fc1": 0, "fc2": 0}


def twin_graph(weights: dict[str, np.ndarray], variant: str = "float32") -> Graph:
    """The test model: CONV_2D 3x3 -> DEPTHWISE_CONV_2D 3x3 -> RESHAPE -> FULLY_CONNECTED x2 ->
    SOFTMAX on an 8x8x3 input, from ``weights`` in TFLite's layouts (``conv`` [out, kh, kw, in],
    ``depthwise`` [1, kh, kw, C], ``fc1``/``fc2`` [out, in], biases ``*_bias``).

    ``variant``: ``float32``, ``int8`` (per channel), ``uint8`` (per tensor), ``int16`` (per
    channel) or ``float16`` (float16 weights, each through a DEQUANTIZE op).
    """
    g = Graph()
    x = g.add(Tensor("serving_default_input:0", (1, 8, 8, 3)))
    g.inputs = [x]
    c = weights["conv"].shape[0]
    shapes = {"conv": (1, 6, 6, c), "depthwise": (1, 4, 4, c)}
    flat = 16 * c
    shapes["fc1"] = (1, weights["fc1"].shape[0])
    shapes["fc2"] = (1, weights["fc2"].shape[0])
    codes = {"conv": CONV_2D, "depthwise": DEPTHWISE_CONV_2D, "fc1": FULLY_CONNECTED, "fc2": FULLY_CONNECTED}
    names = {"conv": "model/conv/Conv2D", "depthwise": "model/depthwise/depthwise", "fc1": "model/hidden/MatMul",
             "fc2": "model/out/MatMul"}
    if variant != "float32":
        names = {k: f"tfl.pseudo_qconst{i}" for i, k in enumerate(names)}  # the converter's names differ
    prev = x
    for key in ("conv", "depthwise", "fc1", "fc2"):
        w = weights[key].astype(np.float32)
        wt = _weight_tensor(names[key], w, AXES[key], variant)
        w_index = g.add(wt)
        if variant == "float16":
            deq = g.add(Tensor(names[key] + "_dequantize", w.shape))
            g.ops.append(Op(DEQUANTIZE, [w_index], [deq]))
            w_index = deq
        bias = weights[f"{key}_bias"].astype(np.float32)
        b_index = g.add(Tensor(names[key] + "/bias", bias.shape, FLOAT32, bias.astype("<f4").tobytes()))
        if key == "fc1":
            shape_const = g.add(Tensor("model/flatten/Const", (2,), INT32, np.array([1, flat], "<i4").tobytes()))
            reshaped = g.add(Tensor("model/flatten/Reshape", (1, flat)))
            g.ops.append(Op(RESHAPE, [prev, shape_const], [reshaped]))
            prev = reshaped
        out = g.add(Tensor(f"model/{key}/out", shapes[key]))
        g.ops.append(Op(codes[key], [prev, w_index, b_index], [out], weights_format=0 if codes[key] == 9 else None))
        prev = out
    probs = g.add(Tensor("StatefulPartitionedCall:0", shapes["fc2"]))
    g.ops.append(Op(SOFTMAX, [prev], [probs]))
    g.outputs = [probs]
    return g


def _weight_tensor(name: str, w: np.ndarray, axis: int, variant: str) -> Tensor:
    if variant == "float32":
        return Tensor(name, w.shape, FLOAT32, w.astype("<f4").tobytes())
    if variant == "float16":
        return Tensor(name, w.shape, FLOAT16, w.astype("<f2").tobytes())
    if variant in ("int8", "int16"):
        bits = 8 if variant == "int8" else 16
        q, scale = quantize_symmetric(w, axis, bits)
        return Tensor(name, w.shape, INT8 if bits == 8 else INT16, q.astype("<i2" if bits == 16 else "i1").tobytes(),
                      scale=scale.tolist(), zero_point=[0] * len(scale), axis=axis)
    if variant == "uint8":
        q8, s, z = quantize_uint8(w)
        return Tensor(name, w.shape, UINT8, q8.tobytes(), scale=[s], zero_point=[z], axis=0)
    raise ValueError(variant)


def random_weights(seed: int = 0, channels: int = 4, hidden: int = 32, classes: int = 10) -> dict[str, np.ndarray]:
    """Float weights for :func:`twin_graph`, in TFLite's layouts. Each output channel has its own
    scale (log-uniform over e^±1.5), as trained layers do: per-channel scales then matter."""
    rng = np.random.default_rng(seed)

    def weight(shape: tuple[int, ...], axis: int) -> np.ndarray:
        gains = np.exp(rng.uniform(-1.5, 1.5, shape[axis]))
        view = [1] * len(shape)
        view[axis] = -1
        return (rng.standard_normal(shape) * gains.reshape(view)).astype(np.float32)

    return {"conv": weight((channels, 3, 3, 3), 0), "conv_bias": rng.standard_normal(channels).astype(np.float32),
            "depthwise": weight((1, 3, 3, channels), 3),
            "depthwise_bias": rng.standard_normal(channels).astype(np.float32),
            "fc1": weight((hidden, 16 * channels), 0), "fc1_bias": rng.standard_normal(hidden).astype(np.float32),
            "fc2": weight((classes, hidden), 0), "fc2_bias": rng.standard_normal(classes).astype(np.float32)}
