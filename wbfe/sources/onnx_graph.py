"""What an ONNX graph does with each stored tensor: which are weights (followed through pass-through and
slicing operators to the operator that consumes them), how each is oriented, the model's order and the head.
The rules in full: docs/checkpoints.md. No tensor data is read here; :mod:`wbfe.sources.onnx_files` reads it.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np

from wbfe.render.text import shape_text
from wbfe.sources.signal_constants import DFT_REASON, dft_shaped, is_dft_basis, name_reason, signal_name

__all__ = ["Stored", "Planned", "GraphPlan", "plan_graph", "node_label", "is_dft_basis", "WEIGHT_INPUT",
           "RECURRENT_GATES"]

# The weight input of each operator that multiplies by a weight.
WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Conv": 1, "ConvTranspose": 1, "Gather": 0, "QLinearMatMul": 3,
                "QLinearConv": 3, "QGemm": 3}
# Operators that take a quantised weight with its scale and zero point (inputs 3, 4, 5), and the axis of a
# per-channel scale (a MatMul's B column, a Conv's W row; QGemm's: its output's, by transB).
_QLINEAR = {"QLinearMatMul": -1, "QLinearConv": 0, "QGemm": None}
_BIAS_OPS = {"Gemm": 2, "Conv": 2, "ConvTranspose": 2, "LSTM": 3, "GRU": 3, "RNN": 3, "QLinearConv": 8, "QGemm": 6}
# Recurrent operators, the number of gates stacked in their W ([directions, gates·hidden, in]) and
# R ([directions, gates·hidden, hidden]), inputs 1 and 2.
RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
# Operators an exporter slices and stacks a recurrent weight with, and the inputs that carry it.
_SHAPING = {"Slice": (0,), "Split": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Gather": (0,), "Concat": None}


@dataclass
class Stored:
    """A stored tensor: an initializer or a Constant node's value, in the graph at ``scope``."""

    vid: int
    name: str
    scope: str
    tensor: Any = None  # a TensorProto (initializer or Constant ``value``)
    array: Any = None  # a numpy array (Constant ``value_float(s)`` / ``value_int(s)``)
    constant: Optional[str] = None  # the Constant node's label, None for an initializer
    skip: Optional[str] = None  # a Constant that cannot be read (a sparse value)


@dataclass
class Planned:
    """A stored tensor and what the graph does with it."""

    stored: Stored
    name: str  # unique among the listed tensors
    shape: tuple[int, ...]  # as reported (out × in for a transposed weight)
    dtype: str
    transpose: bool = False
    # in_out where the consuming op stores its weight transposed (ConvTranspose: [in, out/groups, k...], as PyTorch's)
    layout: str = "out_in"
    quant: Optional[str] = None
    skip: Optional[str] = None
    consumers: list[str] = field(default_factory=list)
    dq: Optional[tuple[int, Optional[int], int, int]] = None  # (scale vid, zero point vid, axis, block size)
    index: Optional[int] = None  # a recurrent operand's direction: the slice along the stored axis 0 it is
    directions: int = 1  # how many such slices the stored tensor holds
    position: float = float("inf")  # of the first node using it (graph order, subgraphs in place)
    used_at: list[int] = field(default_factory=list)  # positions of the nodes using it as a weight


@dataclass
class GraphPlan:
    tensors: list[Planned]
    head: Optional[str]
    stored: dict[int, Stored]


@dataclass
class _Use:
    node: Any
    index: int
    position: int


class _Walker:
    def __init__(self, onnx: Any):
        self.onnx = onnx
        self.new = itertools.count(1).__next__  # value ids
        self.position = 0
        self.stored: dict[int, Stored] = {}
        self.shape: dict[int, tuple[int, ...]] = {}
        self.dtype: dict[int, int] = {}
        self.uses: dict[int, list[_Use]] = defaultdict(list)
        self.passes: dict[int, list[int]] = defaultdict(list)  # value -> values it becomes (If outputs)
        self.carried: dict[tuple[int, int], int] = {}  # (Loop position, input index) -> body input value
        self.producer: dict[int, tuple[Any, int]] = {}  # value -> (node, position)
        # By node position (a node's place in graph order, subgraphs in place: unique per node).
        self.inputs_of: dict[int, list[Optional[int]]] = {}  # its inputs' values (None: no input)
        self.outputs_of: dict[int, list[int]] = {}  # its outputs' values

    def walk(self, graph: Any, chain: list[dict[str, int]], scope: str) -> dict[str, int]:
        local: dict[str, int] = {}
        scopes = chain + [local]
        for value in graph.input:
            local[value.name] = self.new()
        for tensor in graph.initializer:
            vid = local[tensor.name] = self.new()
            self.stored[vid] = Stored(vid, tensor.name, scope, tensor=tensor)
            self.shape[vid], self.dtype[vid] = _dims(tensor), int(tensor.data_type)
        for sparse in graph.sparse_initializer:  # onnxruntime runs them; they were neither scored nor listed
            vid = local[sparse.values.name] = self.new()
            self.stored[vid] = Stored(vid, sparse.values.name, scope, skip="sparse initializer: wbfe reads dense "
                                      "weights only")
            self.shape[vid], self.dtype[vid] = _dims(sparse), int(sparse.values.data_type)
        for node in graph.node:
            position = self.position
            self.position += 1
            ins = [_resolve(scopes, name) if name else None for name in node.input]
            self.inputs_of[position] = ins
            for i, used in enumerate(ins):
                if used is not None:
                    self.uses[used].append(_Use(node, i, position))
            outs = self.outputs_of[position] = [self.new() for _ in node.output]
            if node.op_type == "Constant" and outs:
                self._constant(node, outs[0], scope)
            # then_branch before else_branch, whatever order the attributes were stored in (onnx.helper sorts them)
            for attr in sorted(node.attribute, key=lambda a: a.name != "then_branch"):
                graphs = {self.onnx.AttributeProto.GRAPH: [attr.g], self.onnx.AttributeProto.GRAPHS: attr.graphs}
                for k, sub in enumerate(graphs.get(attr.type, [])):
                    inner = self.walk(sub, scopes, f"{scope}{node.name or node.op_type}/{attr.name}{k or ''}/")
                    if node.op_type == "If":  # a branch's outputs are the If's outputs
                        for out, target in zip(sub.output, outs):
                            source = _resolve(scopes + [inner], out.name)
                            if source is not None:
                                self.passes[source].append(target)
                    if node.op_type == "Loop":  # Loop inputs 2.. are the body's inputs 2.. (carried state)
                        for i in range(2, min(len(ins), len(sub.input))):
                            self.carried[(position, i)] = inner[sub.input[i].name]
            for name, vid in zip(node.output, outs):
                if name:
                    local[name] = vid
                    self.producer[vid] = (node, position)
        return local

    def _constant(self, node: Any, vid: int, scope: str) -> None:
        stored = Stored(vid, node.output[0], scope, constant=node_label(node))
        for attr in node.attribute:
            if attr.name == "value":
                stored.tensor = attr.t
                self.shape[vid], self.dtype[vid] = _dims(attr.t), int(attr.t.data_type)
            elif attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
                kind = np.float32 if "float" in attr.name else np.int64
                stored.array = np.asarray(self.onnx.helper.get_attribute_value(attr), dtype=kind)
                self.shape[vid] = tuple(stored.array.shape)
                self.dtype[vid] = int(self.onnx.helper.np_dtype_to_tensor_dtype(np.dtype(kind)))
            elif attr.name == "sparse_value":
                stored.skip = "sparse constant: wbfe reads dense weights only"
                self.shape[vid], self.dtype[vid] = _dims(attr.sparse_tensor), int(attr.sparse_tensor.values.data_type)
        if stored.tensor is not None or stored.array is not None or stored.skip is not None:
            self.stored[vid] = stored

    def recurrent(self, vid: int, transposed: bool, ndim: int,
                  inputs: tuple[int, ...] = (1, 2)) -> list[tuple[_Use, bool, bool]]:
        """The ``inputs`` (W, R) of recurrent operators among what :meth:`follow` reaches through shaping operators
        too (a ``Gather`` followed only with constant indices)."""
        return [(use, flip, shaped) for use, flip, shaped in self.follow(vid, transposed, ndim, shaping=True)
                if use.node.op_type in RECURRENT_GATES and use.index in inputs]

    def follow(self, vid: int, transposed: bool, ndim: int, shaping: bool = False) -> list[tuple[_Use, bool, bool]]:
        """The uses an ``ndim``-D value reaches through pass-through (and, ``shaping``, slicing and stacking)
        operators, in graph order, with whether it is transposed there and whether it was sliced or stacked."""
        out: list[tuple[_Use, bool, bool]] = []
        seen: set[tuple[int, bool, bool]] = set()
        stack = [(vid, transposed, False)]
        while stack:
            value, flip, shaped = stack.pop()
            if (value, flip, shaped) in seen:
                continue
            seen.add((value, flip, shaped))
            stack += [(target, flip, shaped) for target in self.passes.get(value, [])]
            for use in self.uses.get(value, []):
                node, outputs = use.node, self.outputs_of[use.position]
                carriers = _SHAPING.get(node.op_type, ())
                if use.index == 0 and node.op_type in ("Identity", "Cast") and outputs:
                    stack.append((outputs[0], flip, shaped))
                elif (use.index == 0 and node.op_type == "Transpose" and outputs and not shaped and ndim == 2
                      and next((list(self.onnx.helper.get_attribute_value(a)) for a in node.attribute
                                if a.name == "perm"), None) in (None, [1, 0])):
                    stack.append((outputs[0], not flip, shaped))
                elif node.op_type == "Loop" and (use.position, use.index) in self.carried:
                    stack.append((self.carried[(use.position, use.index)], flip, shaped))
                elif shaping and (carriers is None or use.index in carriers) and (  # a Gather with constant indices
                        node.op_type != "Gather" or [*self.inputs_of[use.position], None][1] in self.stored):
                    stack += [(out, flip, True) for out in outputs]
                else:
                    out.append((use, flip, shaped))
        return sorted(out, key=lambda u: u[0].position)

    def weighs(self, use: _Use) -> bool:
        """Whether the use is the weight input of its operator: input A of a MatMul or Gemm counts where B is not
        stored (W·x, the activation on the right)."""
        if use.index == 0 and use.node.op_type in ("MatMul", "Gemm"):
            return [*self.inputs_of[use.position], None][1] not in self.stored
        return WEIGHT_INPUT.get(use.node.op_type) == use.index

    def attrs(self, node: Any) -> dict[str, Any]:
        return {a.name: self.onnx.helper.get_attribute_value(a) for a in node.attribute}


def _dims(tensor: Any) -> tuple[int, ...]:
    """A stored tensor's shape; ``ValueError`` for a negative size, which numpy would read as "the rest" (-1)."""
    dims = tuple(int(d) for d in tensor.dims)
    if any(d < 0 for d in dims):
        raise ValueError(f"tensor {tensor.name[:100]!r} of shape {list(dims)}: a negative size")
    return dims


def _resolve(scopes: list[dict[str, int]], name: str) -> Optional[int]:
    return next((scope[name] for scope in reversed(scopes) if name in scope), None)


def node_label(node: Any) -> str:
    """A node as messages name it: ``name (OpType)``, its first output standing in for a missing name."""
    return f"{node.name or (node.output[0] if node.output else '?')} ({node.op_type})"


def plan_graph(onnx: Any, graph: Any, dtype_name: Any, values: Optional[Any] = None) -> GraphPlan:
    """The stored tensors of ``graph`` (and its subgraphs) and what each is, in the model's order, and the
    head: the weight of the last Gemm/MatMul the graph's first output depends on.

    Args:
        dtype_name: maps an ONNX data type code to wbfe's dtype name.
        values: reads a planned weight as a numpy array in its reported orientation; given, a weight
            shaped like a DFT basis is read and, if it is one, skipped.
    """
    walker = _Walker(onnx)
    main = walker.walk(graph, [], "")
    plans = {vid: Planned(s, s.name, walker.shape[vid], dtype_name(walker.dtype[vid]), skip=s.skip)
             for vid, s in walker.stored.items()}
    consumed: dict[int, str] = {}
    for vid, plan in plans.items():
        uses = walker.follow(vid, False, len(plan.shape))
        plan.position = uses[0][0].position if uses else plan.position
        if plan.skip is None:
            _plan_one(walker, vid, plan, consumed, uses)
            if plan.skip is None and plan.quant is not None:
                plan.dtype = "float32"  # as DequantizeLinear returns it
        else:  # a sparse weight: where it is used, so that an earlier weight is not taken for a sparse head
            plan.used_at = [u.position for u, _, _ in uses if walker.weighs(u)]
    for vid, reason in consumed.items():
        plans[vid].skip = reason
    for plan in plans.values():
        if values is not None and plan.skip is None and plan.quant is None and dft_shaped(plan.shape) \
                and is_dft_basis(values(plan)):
            plan.skip = DFT_REASON
    # Initializers always; a Constant when it is a weight, a DequantizeLinear operand, or a table; a recurrent
    # operand holding two directions as name[0] and name[1].
    kept = [p for vid, p in plans.items() if p.stored.constant is None or vid in consumed or p.consumers
            or len(p.shape) >= 2]
    listed = [replace(p, name=f"{p.name}[{d}]", index=d, consumers=list(p.consumers), used_at=list(p.used_at))
              if p.directions > 1 else p for p in kept for d in range(p.directions)]
    counts = Counter(plan.name for plan in listed)
    for plan in listed:  # the same name in two scopes: qualified by the scope
        if counts[plan.name] > 1 and plan.stored.scope:
            plan.name = plan.stored.scope + plan.name
    listed.sort(key=lambda p: p.position)  # stable: stored order among equals
    start = main.get(graph.output[0].name) if graph.output else None
    return GraphPlan(listed, _head(walker, start, listed), walker.stored)


def _plan_one(walker: _Walker, vid: int, plan: Planned, consumed: dict[int, str],
              found: list[tuple[_Use, bool, bool]]) -> None:
    ndim = len(plan.shape)
    sources = [(vid, False)]  # the values that carry the weight: itself, or the outputs that dequantise it
    dq = [(use, flip) for use, flip, _ in found if use.node.op_type == "DequantizeLinear" and use.index == 0]
    if dq:
        if len({_dequantisation(walker, use) for use, _ in dq}) > 1:  # the runtime computes each: no one weight
            plan.skip = ("dequantised by two DequantizeLinear nodes with different scales or zero points "
                         f"({', '.join(node_label(u.node) for u, _ in dq[:2])}): no single float weight")
            return
        attrs = walker.attrs(dq[0][0].node)
        if not _dequantised(walker, plan, dq[0][0], 1, int(attrs.get("axis", 1)), int(attrs.get("block_size", 0)),
                            consumed):
            return
        sources = [(outs[0], flip) for use, flip in dq if (outs := walker.outputs_of[use.position])]
        found = sorted((u for v, f in sources for u in walker.follow(v, f, ndim)), key=lambda u: u[0].position)
    recurrent = sorted((u for v, f in sources for u in walker.recurrent(v, f, ndim)), key=lambda u: u[0].position)
    if recurrent:
        _plan_recurrent(walker, plan, recurrent)
        return
    weight_uses = [(use, flip) for use, flip, _ in found if walker.weighs(use)]
    integer = next((u for u, *_ in found if u.node.op_type in ("MatMulInteger", "ConvInteger") and u.index == 1), None)
    if integer is not None:
        plan.skip = (f"integer weight of {node_label(integer.node)}: its scale is applied after the product, which "
                     "wbfe does not follow")
        return
    if not weight_uses:
        if found:
            what = ", ".join(f"{node_label(u.node)} input {u.index}" for u, _, _ in found[:3])
            bias = any(_BIAS_OPS.get(u.node.op_type) == u.index for u, _, _ in found)
            into = walker.recurrent(vid, False, ndim, inputs=(3,)) if not bias else []
            if into:  # a recurrent bias the exporter slices and stacks, as it does the weights
                bias, what = True, f"{what}, into {node_label(into[0][0].node)} input 3"
            plan.skip = ("bias" if bias else "not a weight input") + f" (consumed by {what})"
        else:
            plan.skip = ("initializer no node uses as a weight (graph input default or unused)"
                         if plan.stored.constant is None else f"constant {plan.stored.constant} that no node uses")
        return
    use, transposed = weight_uses[-1]
    node = use.node
    plan.consumers = [node_label(u.node) for u, _ in weight_uses]
    plan.used_at = [u.position for u, _ in weight_uses]
    names = [plan.name, plan.stored.constant or ""] + plan.consumers
    signal = signal_name(names)
    if signal is not None:
        plan.skip = name_reason(signal)
        return
    flags = walker.attrs(node)
    if node.op_type in _QLINEAR:
        axis = _QLINEAR[node.op_type]
        if not _dequantised(walker, plan, use, 4, (0 if flags.get("transB") else 1) if axis is None else axis, 0,
                            consumed):
            return
    if node.op_type in ("MatMul", "Gemm", "QLinearMatMul", "QGemm") and len(plan.shape) != 2:
        plan.skip = f"{len(plan.shape)}-D {node.op_type} operand (batched weights are not read)"
        return
    if node.op_type in ("Gemm", "QGemm"):  # B is stored in × out unless transB; A (W·x) out × in unless transA
        transposed ^= (use.index != 0) ^ bool(flags.get("transA" if use.index == 0 else "transB"))
    elif node.op_type in ("MatMul", "QLinearMatMul"):
        transposed ^= use.index != 0
    elif node.op_type == "ConvTranspose":
        plan.layout = "in_out"
    plan.transpose = transposed
    if transposed:
        plan.shape = (plan.shape[1], plan.shape[0])


def _dequantised(walker: _Walker, plan: Planned, use: _Use, scale_at: int, axis: int, block: int,
                 consumed: dict[int, str]) -> bool:
    """Whether the quantised weight ``plan`` can be dequantised with the scale and zero point ``use`` takes at
    inputs ``scale_at`` and ``scale_at + 1`` (then recorded, and they listed as consumed); else it is skipped."""
    # the scale's and zero point's values (None: an input left out, or one no value names)
    scale, zero = [*walker.inputs_of[use.position], None, None, None][scale_at:scale_at + 2]
    if scale not in walker.stored or (zero is not None and zero not in walker.stored):
        plan.skip = f"quantised weight whose {use.node.op_type} scale is not an initializer"
        return False
    plan.dq, plan.quant = (scale, zero, axis, block), f"onnx-{plan.dtype}"
    consumed[scale] = f"consumed: scale of quantised weight {plan.name} ({node_label(use.node)})"
    if zero is not None:
        consumed[zero] = f"consumed: zero point of quantised weight {plan.name} ({node_label(use.node)})"
    return True


def _dequantisation(walker: _Walker, use: _Use) -> tuple[Any, ...]:
    """What a DequantizeLinear computes from its input: its scale's and zero point's stored contents (equal values
    stored alike compare equal, whatever their names) and its attributes."""
    contents = []
    for vid in [*walker.inputs_of[use.position], None, None][1:3]:
        stored = walker.stored.get(vid) if vid is not None else None
        if stored is None or stored.tensor is None:
            array = None if stored is None else stored.array
            contents.append(vid if array is None else (array.dtype.str, array.shape, array.tobytes()))
        else:
            tensor = type(stored.tensor)()
            tensor.CopyFrom(stored.tensor)
            tensor.name = ""
            contents.append(tensor.SerializeToString())
    attrs = sorted((a.name, str(walker.onnx.helper.get_attribute_value(a))) for a in use.node.attribute)
    return (*contents, *attrs)


def _plan_recurrent(walker: _Walker, plan: Planned, uses: list[tuple[_Use, bool, bool]]) -> None:
    """A stored tensor reaching the W or R input of an LSTM/GRU/RNN: the stacked matrix of its gates, one per
    direction of a 3-D operand; a shape that cannot be one is skipped, saying why."""
    use, transposed, shaped = uses[-1]
    node = use.node
    plan.consumers = [f"{node_label(u.node)} {'W' if u.index == 1 else 'R'}" for u, _, _ in uses]
    plan.used_at = [u.position for u, _, _ in uses]
    shape = plan.shape
    if len(shape) == 3:
        plan.index, plan.directions = 0, shape[0]
        shape = shape[1:]
    elif len(shape) != 2 or not shaped:  # a 2-D operand is one only once the chain has unsqueezed it
        plan.skip = f"{len(shape)}-D operand of {plan.consumers[-1]} (wbfe reads [directions, gates·hidden, in])"
        return
    if transposed:
        plan.transpose = True
        shape = (shape[1], shape[0])
    gates = RECURRENT_GATES[node.op_type]
    attrs = walker.attrs(node)
    hidden = int(attrs.get("hidden_size", 0))
    directions = 2 if attrs.get("direction") in (b"bidirectional", "bidirectional") else 1
    # fed as it is, the operand holds every gate; sliced, a part of a stacked matrix may hold fewer
    fits = hidden <= 0 or (shape[0] % hidden == 0 and shape[0] <= gates * hidden if shaped
                           else shape[0] == gates * hidden) and (use.index == 1 or shape[1] == hidden)
    if not fits or (not shaped and plan.directions != directions):
        plan.skip = (f"{shape_text(plan.shape)} operand of {plan.consumers[-1]} does not fit "
                     f"{directions} direction(s) of {gates} gate(s) of hidden_size {hidden}: wbfe cannot tell "
                     "its layout")
        plan.index, plan.directions, plan.transpose = None, 1, False
        return
    plan.shape = shape


def _head(walker: _Walker, start: Optional[int], listed: list[Planned]) -> Optional[str]:
    """The weight of the last Gemm/MatMul the value ``start`` depends on, looking into ``If`` branches."""
    by_node = {position: plan.name if plan.skip is None else None for plan in listed
               if plan.skip is None or plan.stored.skip is not None for position in plan.used_at}
    back: dict[int, list[int]] = defaultdict(list)
    for source, targets in walker.passes.items():
        for target in targets:
            back[target].append(source)
    seen: set[int] = set()  # the values it depends on
    stack = [start] if start is not None else []
    while stack:
        vid = stack.pop()
        if vid not in seen:
            seen.add(vid)
            stack += back.get(vid, [])
            if vid in walker.producer:
                stack += [v for v in walker.inputs_of.get(walker.producer[vid][1], []) if v is not None]
    reached = [position for node, position in (walker.producer[v] for v in seen if v in walker.producer)
               if node.op_type in ("Gemm", "MatMul", "QGemm", "QLinearMatMul") and position in by_node]
    return by_node[max(reached)] if reached else None
