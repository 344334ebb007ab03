"""Fuzz the ONNX reader: one ``model.onnx`` (protobuf, initializers, the graph that says which
tensors are weights, QDQ dequantisation)."""

from __future__ import annotations

from benchmarks.fuzz.common import check_source, put

NAME = "onnx"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as an ONNX model; raise on a finding."""
    check_source(put("model.onnx", data))


def seeds() -> dict[str, bytes]:
    """Models built with ``onnx.helper``: an MLP (Gemm, MatMul, float and float16 initializers,
    raw and typed data), a CNN, and a QDQ-quantised MatMul."""
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
    return {"mlp.onnx": mlp, "cnn.onnx": cnn, "qdq.onnx": qdq}
