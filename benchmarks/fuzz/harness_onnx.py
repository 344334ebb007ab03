"""Fuzz the ONNX reader: one ``model.onnx`` (protobuf, initializers, the graph that says which
tensors are weights, QDQ dequantisation).

Independent check: the reader lists exactly the model's initializers and ``Constant`` values as
the ``onnx`` package parses the same bytes, and each tensor read holds what
``onnx.numpy_helper.to_array`` reads for it (a dequantised weight is a transform, not compared);
a model ``onnx`` refuses that the reader read is a finding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from benchmarks.fuzz.common import RefusedTensor, check_source, put
from benchmarks.fuzz.harness_safetensors import read_as  # another format's magic goes to that reader

NAME = "onnx"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as an ONNX model; raise on a finding."""
    path = put("model.onnx", data)
    check_source(path, reference=lambda: _onnx_parse(path) if read_as(path, "onnx") else None)


def _onnx_parse(path: Path) -> Optional[dict[str, Any]]:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load(str(path), load_external_data=False)
        graph = model.graph
        quantised = {node.input[0] for node in graph.node if node.op_type == "DequantizeLinear" and node.input}
        out: dict[str, Optional[bytes]] = {}
        for tensor in graph.initializer:
            external = tensor.data_location == onnx.TensorProto.EXTERNAL
            out[tensor.name] = None if external or tensor.name in quantised else _layouts(np, numpy_helper, tensor)
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                values = [a for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR]
                if values:
                    out[node.output[0]] = None if node.output[0] in quantised else _layouts(
                        np, numpy_helper, values[0].t)
    except Exception as exc:  # noqa: BLE001 - any refusal by onnx of a model wbfe read
        raise AssertionError(f"onnx refuses a model the reader read: {type(exc).__name__}: {exc}") from None
    return out


def _layouts(np: Any, numpy_helper: Any, tensor: Any) -> Any:
    """The little-endian bytes of a tensor's values, and of its transpose for a matrix (the reader
    orients a MatMul weight as the graph uses it); a RefusedTensor where onnx cannot read it."""
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as exc:  # noqa: BLE001 - onnx cannot read this tensor: the reader must not either
        return RefusedTensor(f"{type(exc).__name__}: {exc}")
    forms = [array] + ([array.T] if array.ndim == 2 else [])
    return tuple(bytes(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()) for a in forms)


def seeds() -> dict[str, bytes]:
    """Models built with ``onnx.helper``: an MLP (Gemm, MatMul, float and float16 initializers,
    raw and typed data), a CNN, a QDQ-quantised MatMul and an LSTM fed through a Slice/Concat chain."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)

    def model(nodes: list, inits: list, inputs: list, outputs: list) -> bytes:
        graph = helper.make_graph(nodes, "seed", inputs, outputs, initializer=inits)
        built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        return bytes(onnx._serialize(built)) if hasattr(onnx, "_serialize") else built.SerializeToString()

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    w1 = numpy_helper.from_array(rng.standard_normal((10, 6)).astype(np.float32), "fc1.weight")
    b1 = numpy_helper.from_array(np.zeros(10, np.float32), "fc1.bias")
    w2 = helper.make_tensor("fc2.weight", TensorProto.FLOAT, [10, 3], rng.standard_normal(30).tolist())
    mlp = model([helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
                 helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "fc2.weight"], ["y"])],
                [w1, b1, w2], [x], [y])
    img = helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 2, 5, 5])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])
    conv_w = numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float16), "conv.weight")
    cnn = model([helper.make_node("Cast", ["conv.weight"], ["cw"], to=TensorProto.FLOAT),
                 helper.make_node("Conv", ["img", "cw"], ["c"]), helper.make_node("Flatten", ["c"], ["f"]),
                 helper.make_node("Gemm", ["f", "head.weight"], ["z"], transB=1)],
                [conv_w, numpy_helper.from_array(rng.standard_normal((4, 27)).astype(np.float32), "head.weight")],
                [img], [z])
    q = numpy_helper.from_array(rng.integers(-100, 100, (6, 3)).astype(np.int8), "w.q")
    scale = numpy_helper.from_array(np.full(3, 0.02, np.float32), "w.scale")
    zero = numpy_helper.from_array(np.zeros(3, np.int8), "w.zero")
    qdq = model([helper.make_node("DequantizeLinear", ["w.q", "w.scale", "w.zero"], ["w"], axis=1),
                 helper.make_node("MatMul", ["x", "w"], ["y"])], [q, scale, zero], [x], [y])
    # An LSTM fed as torch's exporter feeds it without constant folding: the parameter sliced into
    # its gates, concatenated and unsqueezed into W; R a folded [directions, 4·hidden, hidden].
    seq = helper.make_tensor_value_info("seq", TensorProto.FLOAT, [3, 1, 2])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 1, 1, 2])
    ints = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
            [("s0", [0]), ("s2", [2]), ("s8", [8]), ("ax", [0])]]
    lstm = model([helper.make_node("Slice", ["rnn.weight_ih_l0", "s0", "s2", "ax"], ["g0"]),
                  helper.make_node("Slice", ["rnn.weight_ih_l0", "s2", "s8", "ax"], ["g1"]),
                  helper.make_node("Concat", ["g1", "g0"], ["wc"], axis=0),
                  helper.make_node("Unsqueeze", ["wc", "ax"], ["w"]),
                  helper.make_node("LSTM", ["seq", "w", "r"], ["out"], hidden_size=2)],
                 [numpy_helper.from_array(rng.standard_normal((8, 2)).astype(np.float32), "rnn.weight_ih_l0"),
                  numpy_helper.from_array(rng.standard_normal((1, 8, 2)).astype(np.float32), "r"), *ints],
                 [seq], [out])
    return {"mlp.onnx": mlp, "cnn.onnx": cnn, "qdq.onnx": qdq, "lstm.onnx": lstm}
