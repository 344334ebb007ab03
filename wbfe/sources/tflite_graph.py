"""What a TFLite model's graph holds and does with each stored tensor, as plain data: :func:`parse_model`
reads the flatbuffer into records once, checking every count, index and extent; :func:`plan_graph` decides
from the operators what each constant is, the model's order and the head (docs/formats.md).
"""

from __future__ import annotations

import math
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from wbfe.errors import CorruptCheckpointError, clip
from wbfe.linalg.arrays import is_known_dtype, itemsize

__all__ = ["TflTensor", "TflQuant", "TflOp", "TflBuffer", "TflSubgraph", "TflModel", "Planned", "GraphPlan",
           "parse_model", "plan_graph", "DTYPES", "ITEMSIZE", "QUANTISED", "STORED_AXES", "TORCH_AXES", "reported_shape"]

# TensorType codes (schema.fbs) -> wbfe's dtype names (torch's where torch has one).
DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "string", 6: "bool", 7: "int16",
          8: "complex64", 9: "int8", 10: "float64", 11: "complex128", 12: "uint64", 13: "resource",
          14: "variant", 15: "uint32", 16: "uint16", 17: "int4", 18: "bfloat16"}
ITEMSIZE = {name: itemsize(name) for name in DTYPES.values() if is_known_dtype(name)}

# The weight input of each operator that multiplies by a weight, and the rank that weight must have.
_WEIGHT_OPS: dict[str, tuple[int, int]] = {
    "CONV_2D": (1, 4), "DEPTHWISE_CONV_2D": (1, 4), "TRANSPOSE_CONV": (1, 4), "FULLY_CONNECTED": (1, 2),
    "CONV_3D": (1, 5), "BATCH_MATMUL": (1, 2), "EMBEDDING_LOOKUP": (1, 2), "GATHER": (0, 2),
}
# How each op's weight is stored, as a name (what the reader converts from).
STORED_AXES = {"CONV_2D": "[out, kh, kw, in]", "DEPTHWISE_CONV_2D": "[1, kh, kw, C]",
               "TRANSPOSE_CONV": "[out, kh, kw, in]", "FULLY_CONNECTED": "[out, in]",
               "CONV_3D": "[kd, kh, kw, in, out]", "BATCH_MATMUL": "[in, out]", "EMBEDDING_LOOKUP": "[rows, width]",
               "GATHER": "[rows, width]"}
# The permutation from the stored layout of a convolution's weight to PyTorch's [out, in, k...].
TORCH_AXES = {"CONV_2D": (0, 3, 1, 2), "TRANSPOSE_CONV": (0, 3, 1, 2), "DEPTHWISE_CONV_2D": (3, 0, 1, 2),
              "CONV_3D": (4, 3, 0, 1, 2)}
EMPTY_WEIGHT = "empty weight tensor (0 elements)"
# The values each quantised integer type holds (a zero point must be one of them).
QUANTISED = ("int4", "int8", "uint8", "int16")
_RANGES = {"int4": (-8, 8), "int8": (-128, 128), "uint8": (0, 256), "int16": (-32768, 32768)}
# Operators a stored weight passes through on its way to the op that multiplies by it: float16
# and dynamic-range models dequantise their weights in the graph, sparse ones densify them.
_PASS_OPS = ("DEQUANTIZE", "DENSIFY")
_BIAS_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "CONV_3D")
# The few options the planner reads: op -> (its BuiltinOptions union tag (schema.fbs), options class, key, value).
_OPTIONS = {"FULLY_CONNECTED": (8, "FullyConnectedOptions", "weights_format", lambda o: int(o.WeightsFormat())),
            "BATCH_MATMUL": (101, "BatchMatMulOptions", "adj_y", lambda o: bool(o.AdjY()))}


@dataclass(frozen=True)
class TflBuffer:
    start: int
    size: int
    external: bool = False  # in the trailing area of a >2 GB model (Buffer.offset/size)


@dataclass(frozen=True)
class TflQuant:
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int


@dataclass(frozen=True)
class TflTensor:
    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    buffer: int
    quant: Optional[TflQuant] = None
    sparse: bool = False
    variable: bool = False
    custom_quant: bool = False


@dataclass(frozen=True)
class TflOp:
    position: int
    op: str  # BuiltinOperator name (CUSTOM:<code> for a custom one)
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)  # the few options the planner reads


@dataclass(frozen=True)
class TflSubgraph:
    name: str
    tensors: tuple[TflTensor, ...]
    ops: tuple[TflOp, ...]
    outputs: tuple[int, ...]
    inputs: tuple[int, ...] = ()


@dataclass(frozen=True)
class TflModel:
    version: int
    description: str
    subgraphs: tuple[TflSubgraph, ...]
    buffers: tuple[TflBuffer, ...]


@dataclass
class Planned:
    tensor: TflTensor
    name: str
    shape: tuple[int, ...]  # as reported: [out, in, k...] for a weight
    op: Optional[str] = None  # the consuming weight op: decides the conversion
    skip: Optional[str] = None
    consumers: list[str] = field(default_factory=list)
    position: float = math.inf
    used_at: list[int] = field(default_factory=list)
    transpose: bool = False  # a BATCH_MATMUL weight stored [in, out]


@dataclass
class GraphPlan:
    tensors: list[Planned]
    head: Optional[str]
    note: Optional[str]


class _Reader:
    def __init__(self, buf: Any, size: int, path: str):
        self.buf, self.size, self.path = buf, size, path
        self.what = "the model header"

    def fail(self, why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError.at(self.path, f"{self.what}: {why}")

    def count(self, n: int, width: int, what: str) -> int:
        if n < 0 or n * width > self.size:
            raise self.fail(f"{what} vector of {n} entries does not fit in a {self.size}-byte file")
        return n

    def each(self, table: Any, field: str, what: str, where: str = "") -> Iterator[tuple[int, Any]]:
        """The items of a table's vector ``field``, each named ``{where}{what} {i}`` in what fails while it is read."""
        for i in range(self.count(int(getattr(table, f"{field}Length")()), 4, f"{what}s")):
            self.what = f"{where}{what} {i}"
            yield i, getattr(table, field)(i)

    def numbers(self, table: Any, name: str, width: int) -> list[Any]:
        if getattr(table, f"{name}IsNone")():
            return []
        n = self.count(int(getattr(table, f"{name}Length")()), width, name.lower())
        values = getattr(table, f"{name}AsNumpy")()
        if n and len(values) != n:
            raise self.fail(f"{name.lower()} vector cut short")
        return [v.item() for v in values] if n else []

    def string(self, raw: Any) -> str:
        if not raw:
            return ""
        try:
            return str(raw.decode("utf-8"))
        except UnicodeDecodeError:  # schema.fbs strings are UTF-8 (fuzzing found a length past the file's end)
            raise self.fail("a name that is not UTF-8 text") from None


def parse_model(tflite: Any, buf: Any, size: int, path: str) -> TflModel:
    """The model in ``buf`` (the file's bytes, ``size`` long) as plain records (``CorruptCheckpointError``)."""
    reader = _Reader(buf, size, path)
    try:
        return _parse(tflite, reader)
    except CorruptCheckpointError:
        raise
    except struct.error as exc:  # an offset the accessors follow past the end of the file
        raise reader.fail(f"flatbuffer offsets out of range ({clip(str(exc), 100)})") from None
    except (IndexError, ValueError, TypeError, OverflowError, UnicodeDecodeError, AttributeError, MemoryError) as exc:
        raise reader.fail(f"unreadable flatbuffer ({type(exc).__name__}: {clip(str(exc), 100)})") from None


def _parse(tflite: Any, r: _Reader) -> TflModel:
    from tflite.utils import BUILTIN_OPCODE2NAME

    model = tflite.Model.GetRootAs(r.buf, 0)
    version = int(model.Version())
    buffers = [_buffer(b, r) for _, b in r.each(model, "Buffers", "buffer")]
    codes = []
    for _, code in r.each(model, "OperatorCodes", "operator code"):
        builtin = max(int(code.DeprecatedBuiltinCode()), int(code.BuiltinCode()))  # as schema.fbs says
        # 32: CUSTOM; BUILTIN_<n>: a newer operator, which consumes nothing wbfe reads as a weight
        codes.append(f"CUSTOM:{r.string(code.CustomCode())}" if builtin == 32
                     else BUILTIN_OPCODE2NAME.get(builtin, f"BUILTIN_{builtin}"))
    subgraphs = [_subgraph(tflite, sg, s, codes, len(buffers), r) for s, sg in r.each(model, "Subgraphs", "subgraph")]
    r.what = "the model"
    if not subgraphs:
        raise r.fail("no subgraph: not a TFLite model")
    return TflModel(version, r.string(model.Description()), tuple(subgraphs), tuple(buffers))


def _buffer(b: Any, r: _Reader) -> TflBuffer:
    offset, size = int(b.Offset()), int(b.Size())
    if offset > 1:  # schema.fbs: data outside the flatbuffer, at this offset from the file's start
        if offset + size > r.size:
            raise r.fail(f"data at bytes {offset}..{offset + size} lies past the end of the {r.size}-byte file")
        return TflBuffer(offset, size, external=True)
    # Where the data vector lies, not its bytes: the generated class has no accessor for that, so
    # the flatbuffers Table it wraps is asked (field 0 at vtable offset 4).
    tab = b._tab
    o = tab.Offset(4)
    if not o:
        return TflBuffer(0, 0)
    start, n = tab.Vector(o), tab.VectorLen(o)
    if start < 0 or n < 0 or start + n > r.size:
        raise r.fail(f"data at bytes {start}..{start + n} lies past the end of the {r.size}-byte file")
    return TflBuffer(start, n)


def _subgraph(tflite: Any, sg: Any, s: int, codes: list[str], n_buffers: int, r: _Reader) -> TflSubgraph:
    name = r.string(sg.Name())
    tensors = []
    for t, tensor in r.each(sg, "Tensors", "tensor", f"subgraph {s} "):
        tname = r.string(tensor.Name()) or f"tensor_{t}"
        r.what = f"tensor {tname!r} (subgraph {s}, index {t})"
        tensors.append(_tensor(tensor, t, tname, n_buffers, r))
    ops = []
    for k, op in r.each(sg, "Operators", "operator", f"subgraph {s} "):
        index = int(op.OpcodeIndex())
        if index >= len(codes):
            raise r.fail(f"opcode index {index} out of range ({len(codes)} operator codes)")
        ins, outs = r.numbers(op, "Inputs", 4), r.numbers(op, "Outputs", 4)
        for i in ins + outs:
            if i < -1 or i >= len(tensors):  # -1: an optional input left out
                raise r.fail(f"tensor index {i} out of range ({len(tensors)} tensors)")
        ops.append(TflOp(k, codes[index], tuple(ins), tuple(outs), _options(tflite, op, codes[index])))
    r.what = f"subgraph {s}"
    outputs, inputs = r.numbers(sg, "Outputs", 4), r.numbers(sg, "Inputs", 4)
    if any(i < 0 or i >= len(tensors) for i in outputs + inputs):
        raise r.fail(f"input or output tensor index out of range ({len(tensors)} tensors)")
    return TflSubgraph(name, tuple(tensors), tuple(ops), tuple(outputs), tuple(inputs))


def _tensor(tensor: Any, t: int, name: str, n_buffers: int, r: _Reader) -> TflTensor:
    code = int(tensor.Type())
    if code not in DTYPES:
        raise r.fail(f"unknown tensor type {code}")
    shape = tuple(r.numbers(tensor, "Shape", 4))
    if any(d < 0 for d in shape):
        raise r.fail(f"negative dimension in shape {list(shape)}")
    buffer = int(tensor.Buffer())
    if buffer >= n_buffers:
        raise r.fail(f"buffer index {buffer} out of range ({n_buffers} buffers)")
    quant, custom = None, False
    q = tensor.Quantization()
    if q is not None:
        custom = int(q.DetailsType()) != 0
        scale, zero = r.numbers(q, "Scale", 4), r.numbers(q, "ZeroPoint", 8)
        if scale:
            axis = int(q.QuantizedDimension())
            if len(zero) != len(scale):
                raise r.fail(f"{len(scale)} quantisation scales but {len(zero)} zero points")
            if len(scale) > 1 and not (0 <= axis < len(shape) and shape[axis] == len(scale)):
                raise r.fail(f"{len(scale)} quantisation scales along dimension {axis} of shape {list(shape)}")
            low, high = _RANGES.get(DTYPES[code], (-(2 ** 63), 2 ** 63))
            if not all(low <= z < high for z in zero):
                raise r.fail(f"a zero point outside the range of {DTYPES[code]} [{low}, {high - 1}]")
            quant = TflQuant(tuple(float(v) for v in scale), tuple(int(v) for v in zero), axis)
    return TflTensor(t, name, shape, DTYPES[code], buffer, quant, tensor.Sparsity() is not None,
                     bool(tensor.IsVariable()), custom)


def _options(tflite: Any, op: Any, name: str) -> dict[str, Any]:
    kind, table = int(op.BuiltinOptionsType()), op.BuiltinOptions()
    if table is None or name not in _OPTIONS or kind != _OPTIONS[name][0]:
        return {}
    _, cls, key, value = _OPTIONS[name]
    opts = getattr(tflite, cls)()
    opts.Init(table.Bytes, table.Pos)
    return {key: value(opts)}


def plan_graph(model: TflModel) -> GraphPlan:
    """Every constant tensor (whose buffer holds data) of every subgraph, what it is, in the model's order; and the
    head. A 0-element weight (its buffer empty as an activation's) is told by the graph: fed by no operator nor the
    subgraph's inputs, into a weight input; it is listed as skipped."""
    listed: list[Planned] = []
    head: Optional[Planned] = None
    note: Optional[str] = None
    offset = 0
    used: dict[str, int] = defaultdict(int)
    for s, sg in enumerate(model.subgraphs):
        plans = {t.index: Planned(t, t.name, t.shape) for t in sg.tensors
                 if t.buffer > 0 and model.buffers[t.buffer].size > 0}
        producer = {t: op for op in sg.ops for t in op.outputs if t >= 0}
        fed = producer.keys() | set(sg.inputs)
        empty = {t.index: Planned(t, t.name, t.shape) for t in sg.tensors
                 if math.prod(t.shape) == 0 and t.index not in plans and t.index not in fed and not t.variable}
        uses: dict[int, list[tuple[TflOp, int]]] = defaultdict(list)
        for op in sg.ops:
            for i, t in enumerate(op.inputs):
                if t >= 0:
                    uses[t].append((op, i))
        for plan in plans.values():
            _plan_one(plan, uses, offset)
            if plan.skip is None and plan.tensor.variable:
                plan.skip = "variable tensor (state the graph updates), not a weight"
        for plan in empty.values():
            _plan_one(plan, uses, offset)
            if plan.op is not None:  # a weight input: else an empty constant of no interest (a RESHAPE's shape)
                plan.skip, plan.shape, plans[plan.tensor.index] = EMPTY_WEIGHT, plan.tensor.shape, plan
        if s == 0:
            head, note = _head(sg, plans, producer)
        offset += len(sg.ops) + 1
        for plan in sorted(plans.values(), key=lambda p: (p.position, p.tensor.index)):
            if used[plan.name]:  # tensor names need not be unique: qualify the later ones
                plan.name = f"{sg.name or f'subgraph{s}'}/{plan.name}" if s else plan.name
                if used[plan.name]:
                    plan.name = f"{plan.name}#{plan.tensor.index}"
            used[plan.name] += 1
            listed.append(plan)
    return GraphPlan(listed, head.name if head is not None else None, note)


def _plan_one(plan: Planned, uses: dict[int, list[tuple[TflOp, int]]], offset: int) -> None:
    found = list(uses.get(plan.tensor.index, []))
    through: list[tuple[TflOp, int]] = []
    stack, seen = list(found), set()
    while stack:  # DEQUANTIZE, DENSIFY: the weight is what their output feeds
        op, i = stack.pop()
        if (op.position, i) not in seen:
            seen.add((op.position, i))
            if op.op in _PASS_OPS and i == 0 and op.outputs and op.outputs[0] >= 0:
                stack += uses.get(op.outputs[0], [])
            else:
                through.append((op, i))
    through.sort(key=lambda u: u[0].position)
    if found:
        plan.position = offset + min(op.position for op, _ in found)
    weight_uses = [(op, i) for op, i in through if _WEIGHT_OPS.get(op.op, (-1, 0))[0] == i]
    t = plan.tensor
    if not weight_uses:
        if through:
            what = ", ".join(f"{op.op} #{op.position} input {i}" for op, i in through[:3])
            bias = any(op.op in _BIAS_OPS and i == 2 for op, i in through)
            plan.skip = ("bias" if bias else "not a weight input") + f" (consumed by {what})"
        else:
            plan.skip = "constant no operator uses"
        return
    op, _ = weight_uses[0]
    plan.op = op.op
    plan.consumers = [f"{o.op} #{o.position}" for o, _ in weight_uses]
    plan.used_at = [o.position for o, _ in weight_uses]
    rank = _WEIGHT_OPS[op.op][1]
    refusals = (  # the first that holds says why the weight is not read
        (len(t.shape) != rank, f"{len(t.shape)}-D weight of {op.op} (stored {STORED_AXES[op.op]}: {rank}-D expected)"),
        (t.sparse, "sparse tensor (TFLite sparsity parameters): wbfe reads dense weights only"),
        (t.custom_quant, "custom quantisation (QuantizationParameters.details): not read"),
        (op.op == "FULLY_CONNECTED" and op.options.get("weights_format", 0) != 0,
         "FULLY_CONNECTED weights in a shuffled format (SHUFFLED4x16INT8): not read"),
        (op.op == "DEPTHWISE_CONV_2D" and t.shape[:1] != (1,),
         f"DEPTHWISE_CONV_2D weight of shape {list(t.shape)} (stored [1, kh, kw, C] expected)"),
        (t.dtype in QUANTISED and t.quant is None,
         f"{t.dtype} weight without quantisation scales: its real values are unknown"),
        (t.dtype not in ("float32", "float16", "float64", "bfloat16", *QUANTISED),
         f"{t.dtype} weight: wbfe reads float, float16 and int4/int8/uint8/int16-quantised weights"),
    )
    plan.skip = next((why for refused, why in refusals if refused), None)
    if plan.skip is None:
        plan.shape = reported_shape(op.op, t.shape, op.options)
        plan.transpose = op.op == "BATCH_MATMUL" and not op.options.get("adj_y", False)


def reported_shape(op: str, shape: tuple[int, ...], options: Optional[dict[str, Any]] = None) -> tuple[int, ...]:
    """The shape of a weight of ``op`` stored as ``shape``, in PyTorch's [out, in, k...] layout.

    Example:
        >>> reported_shape("CONV_2D", (8, 3, 3, 4)), reported_shape("DEPTHWISE_CONV_2D", (1, 3, 3, 8))
        ((8, 4, 3, 3), (8, 1, 3, 3))
    """
    if op in TORCH_AXES:  # a DEPTHWISE_CONV_2D weight's first axis is 1 (checked by the plan)
        return tuple(shape[i] for i in TORCH_AXES[op])
    if op == "BATCH_MATMUL" and not (options or {}).get("adj_y", False):
        return (shape[1], shape[0])
    return tuple(shape)


def _head(sg: TflSubgraph, plans: dict[int, Planned],
          producer: dict[int, TflOp]) -> tuple[Optional[Planned], Optional[str]]:
    weight_of: dict[int, Planned] = {}
    for plan in plans.values():
        if plan.skip is None and plan.op == "FULLY_CONNECTED":
            for position in plan.used_at:
                weight_of.setdefault(position, plan)
    if not sg.outputs:
        return None, "the main subgraph has no output"
    seen: set[int] = set()  # the produced tensors the output depends on
    stack = [sg.outputs[0]]
    while stack:
        t = stack.pop()
        if t not in seen and t in producer:
            seen.add(t)
            stack += producer[t].inputs
    best = max((producer[t].position for t in seen if producer[t].position in weight_of), default=None)
    if best is None:
        return None, "no FULLY_CONNECTED with a readable weight produces the graph's output"
    return weight_of[best], None
