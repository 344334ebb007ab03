"""ONNX graphs as real exporters and quantisers write them, where wbfe had been quietly wrong: each built with
onnx.helper, each value compared with what onnx's ReferenceEvaluator computes for the graph's own nodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wbfe.linalg.arrays import to_torch
from wbfe.sources import open_source

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

RNG = np.random.default_rng(23)
Q = RNG.integers(-128, 128, size=(6, 4), dtype=np.int8)  # a MatMul B: in × out


def _info(name: str, shape: list[int], kind: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, kind, shape)


def _save(tmp_path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: dict[str, np.ndarray], opset: int = 21) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    onnx.checker.check_model(model)
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    return path


def _entries(path: Path) -> dict[str, object]:
    with open_source(path) as source:
        return {e.name: e for e in source.entries()}


def _value(path: Path, name: str) -> np.ndarray:
    """A value of the graph as onnx's reference runtime computes it."""
    model = onnx.load(str(path))
    model.graph.output.append(helper.make_empty_tensor_value_info(name))
    feeds = {i.name: np.ones([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
             for i in model.graph.input}
    return ReferenceEvaluator(model).run([name], feeds)[0]


@pytest.mark.parametrize("second", ["other scale", "same scale", "equal scale"])
def test_one_initializer_dequantised_twice(tmp_path: Path, second: str) -> None:
    """Two DequantizeLinear nodes of one int8 initializer: with different scales there is no single float weight
    (wbfe had read it with the first node's scale, silently); with the same scale (one initializer, or two holding
    equal values) it is one weight, as the runtime computes it."""
    scales = {"s1": np.float32(0.05), "s2": np.float32(0.5 if second == "other scale" else 0.05)}
    nodes = [helper.make_node("DequantizeLinear", ["wq", "s1"], ["w1"], name="dq1"),
             helper.make_node("DequantizeLinear", ["wq", "s1" if second == "same scale" else "s2"], ["w2"], name="dq2"),
             helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("MatMul", ["x", "w2"], ["y"], name="fc2")]
    path = _save(tmp_path, nodes, [_info("x", [1, 6])], [_info("y", [1, 4]), _info("h", [1, 4])],
                 {"wq": Q, **scales})
    with open_source(path) as source:
        entry = {e.name: e for e in source.entries()}["wq"]
    if second == "other scale":
        assert entry.skip == ("dequantised by two DequantizeLinear nodes with different scales or zero points "
                              "(dq1 (DequantizeLinear), dq2 (DequantizeLinear)): no single float weight")
    else:
        assert entry.skip is None
        assert np.array_equal(to_torch(entry.load()).numpy(), _value(path, "w2").T)
        assert np.array_equal(_value(path, "w1"), _value(path, "w2"))
        assert source.provenance.extra["consumers"]["wq"] == ["fc1 (MatMul)", "fc2 (MatMul)"]


W = RNG.standard_normal((6, 4)).astype(np.float32)  # out × in when it multiplies from the left


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "Gemm transA"])
def test_a_weight_multiplying_from_the_left_is_read_out_by_in(tmp_path: Path, op: str) -> None:
    """y = W·x (MatMul or Gemm with the weight as input A, the activation as B): the weight was skipped as 'not a
    weight input'. It is the weight, out × in as the operator applies it: W as stored, or its transpose under
    transA; checked against the reference runtime's product with the identity."""
    trans = op == "Gemm transA"
    node = helper.make_node(op.split()[0], ["w", "x"], ["y"], name="left", **({"transA": 1} if trans else {}))
    path = _save(tmp_path, [node], [_info("x", [4, 4])], [_info("y", [6, 4])], {"w": W.T.copy() if trans else W})
    entry = _entries(path)["w"]
    assert entry.skip is None and entry.shape == (6, 4)
    model = onnx.load(str(path))
    applied = ReferenceEvaluator(model).run(["y"], {"x": np.eye(4, dtype=np.float32)})[0]  # W·I: W as applied
    assert np.array_equal(to_torch(entry.load()).numpy(), applied)


def test_a_matmul_of_two_stored_tensors_keeps_b_as_the_weight(tmp_path: Path) -> None:
    """A MatMul of two initializers (a folded product): B stays the weight, A is listed as no weight input."""
    nodes = [helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("MatMul", ["x", "p"], ["y"])]
    path = _save(tmp_path, nodes, [_info("x", [1, 6])], [_info("y", [1, 4])], {"a": np.eye(6, dtype=np.float32), "w": W})
    entries = _entries(path)
    assert entries["w"].skip is None and entries["a"].skip.startswith("not a weight input")


I8 = TensorProto.INT8


@pytest.mark.parametrize("op", ["QLinearMatMul", "QLinearConv", "QGemm"])
def test_qoperator_weights_are_dequantised_as_the_operator_computes_them(tmp_path: Path, op: str) -> None:
    """onnxruntime's QOperator format (QLinearMatMul, QLinearConv, com.microsoft's QGemm with transB: the weight,
    its scale and zero point are inputs 3, 4, 5 of the operator; quantize_static writes it) left every weight
    skipped as 'not a weight input'. Each is dequantised as the operator does, per tensor or per output channel
    (a MatMul's B column, a Conv's W row, a transB Gemm's B row), and oriented as MatMul/Conv/Gemm weights are;
    the reference is onnx's DequantizeLinear (ReferenceEvaluator) on the same tensors."""
    conv, gemm = op == "QLinearConv", op == "QGemm"
    shape, axis = ((8, 3, 3, 3), 0) if conv else ((4, 6), 0) if gemm else ((6, 4), 1)
    q = RNG.integers(-128, 128, size=shape, dtype=np.int8)
    scale = RNG.uniform(0.01, 0.1, shape[axis]).astype(np.float32)
    zero = RNG.integers(-3, 4, shape[axis]).astype(np.int8)
    act = {"xs": np.float32(0.1), "xz": np.int8(0), "ys": np.float32(0.2), "yz": np.int8(0)}
    inputs = ["x", "xs", "xz", "w", "ws", "wz", *([""] if gemm else []), "ys", "yz"]
    node = helper.make_node(op, inputs, ["y"], name="qop", **({"domain": "com.microsoft", "transB": 1} if gemm else {}))
    ins, outs = ([[1, 3, 5, 5]], [[1, 8, 3, 3]]) if conv else ([[1, 6]], [[1, 4]])
    path = _save(tmp_path, [node], [_info("x", ins[0], I8)], [_info("y", outs[0], I8)],
                 {"w": q, "ws": scale, "wz": zero, **act})
    with open_source(path) as source:
        entries = {e.name: e for e in source.entries()}
        assert source.head_hint == (None if conv else "w")  # the last matrix product before the output
    entry = entries["w"]
    dq = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["f"], axis=axis)
    graph = helper.make_graph([dq], "dq", [_info("q", list(shape), I8), _info("s", [shape[axis]]),
                                           _info("z", [shape[axis]], I8)], [_info("f", list(shape))])
    want = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])).run(
        ["f"], {"q": q, "s": scale, "z": zero})[0]
    assert entry.skip is None and entry.quant == "onnx-int8"
    assert np.array_equal(to_torch(entry.load()).numpy(), want if conv or gemm else want.T)
    assert entries["ws"].skip.startswith("consumed: scale") and entries["wz"].skip.startswith("consumed: zero")
    assert entries["xs"].skip.startswith("not a weight input")


def test_a_matmulinteger_weight_says_its_scale_is_applied_after_the_product(tmp_path: Path) -> None:
    """quantize_dynamic's MatMulInteger: the weight's scale multiplies the integer product afterwards (a Mul), so the
    weight alone is no float matrix; it was skipped as 'not a weight input' and now says what it is."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["yi"], name="mmi"),
             helper.make_node("Cast", ["yi"], ["yf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]), helper.make_node("Mul", ["yf", "s"], ["y"])]
    path = _save(tmp_path, nodes, [_info("x", [1, 6])], [_info("y", [1, 4])],
                 {"w": Q.view(np.uint8), "wz": np.uint8(128), "ws": np.float32(0.1)})
    assert _entries(path)["w"].skip == ("integer weight of mmi (MatMulInteger): its scale is applied after the "
                                        "product, which wbfe does not follow")
