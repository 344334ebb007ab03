"""ONNX models exported by ``torch.onnx.export`` (inline and with external data) score exactly as
the PyTorch model; a QDQ model quantised by onnxruntime scores as its dequantised weights, within
the bound the quantisation error allows of the original."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import wbfe
from tests.test_gguf import bfe_bound
from wbfe.errors import CorruptCheckpointError, MissingDependencyError, SourceNotFoundError, TruncatedCheckpointError
from wbfe_cli.main import app

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402


class Net(nn.Module):
    """Gather (embedding), Conv, ConvTranspose, a Linear on 3-D input (exported as MatMul with the
    weight stored in × out) and a Linear head on 2-D input (Gemm, transB=1)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.conv = nn.Conv1d(32, 48, 3)
        self.deconv = nn.ConvTranspose1d(48, 40, 3)
        self.proj = nn.Linear(40, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids).transpose(1, 2)
        h = self.deconv(torch.relu(self.conv(h))).transpose(1, 2)
        return self.head(torch.relu(self.proj(h)).mean(1))


@pytest.fixture(scope="module")
def net() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def export(net: Net, path: Path, *, external: bool = False) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randint(0, 100, (2, 12)),), str(path), dynamo=False,
                          input_names=["ids"], output_names=["logits"])
    if external:
        model = onnx.load(str(path))
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=0)
    return path


def param_of(path: Path, net: Net) -> dict[str, str]:
    """Initializer name -> the PyTorch parameter it holds (equal, or equal transposed), found from the
    values read by onnx itself."""
    model = onnx.load(str(path))
    out = {}
    for tensor in model.graph.initializer:
        value = numpy_helper.to_array(tensor)
        for name, p in net.state_dict().items():
            p = p.numpy()
            if (value.shape == p.shape and np.array_equal(value, p)) or (
                    value.ndim == 2 and value.T.shape == p.shape and np.array_equal(value.T, p)):
                out[tensor.name] = name
    return out


@pytest.mark.parametrize("external", [False, True])
def test_scores_exactly_as_the_pytorch_original(tmp_path: Path, net: Net, external: bool) -> None:
    path = export(net, tmp_path / "net.onnx", external=external)
    got = wbfe.score(path, metrics="bfe")
    want = {row["name"]: row for row in wbfe.score(net, metrics="bfe").layers}
    names = param_of(path, net)
    rows = {names[row["name"]]: row for row in got.layers}
    assert set(rows) == {"emb.weight", "conv.weight", "deconv.weight", "proj.weight", "head.weight"}
    for param, row in rows.items():
        assert row["bfe"] == want[param]["bfe"], param
        assert row["shape"] == want[param]["shape"], param  # the MatMul weight reported out × in
        assert row["quant"] is None
    assert {names[s["name"]] for s in got.skipped} == {"conv.bias", "deconv.bias", "proj.bias", "head.bias"}
    assert all("Add" in s["reason"] or s["reason"].startswith("bias") for s in got.skipped)
    assert got.summary["head"] == "head.weight" and got.summary["head_source"] == "config"
    consumers = got.model["consumers"]
    assert consumers["head.weight"] == ["/head/Gemm (Gemm)"] and consumers["emb.weight"] == ["/emb/Gather (Gather)"]
    matmul = next(n for n, p in names.items() if p == "proj.weight")
    assert consumers[matmul] == ["/proj/MatMul (MatMul)"]
    files = [path] + ([tmp_path / "net.onnx.data"] if external else [])
    assert got.model["files"] == [str(f) for f in files]
    if not external:
        assert got.model["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def _calibration(n: int = 8) -> object:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(3)
            self.batches = iter([{"ids": torch.randint(0, 100, (2, 12), generator=g).numpy()} for _ in range(n)])

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    return Reader()


@pytest.mark.parametrize("per_channel,weight_type", [(False, "int8"), (True, "int8"), (True, "uint8")])
def test_qdq_model_dequantised(tmp_path: Path, net: Net, per_channel: bool, weight_type: str) -> None:
    quantization = pytest.importorskip("onnxruntime.quantization")
    source = export(net, tmp_path / "net.onnx")
    path = tmp_path / "net-int8.onnx"
    quantization.quantize_static(str(source), str(path), _calibration(), quant_format=quantization.QuantFormat.QDQ,
                                 per_channel=per_channel,
                                 weight_type=quantization.QuantType.QInt8 if weight_type == "int8" else
                                 quantization.QuantType.QUInt8, activation_type=quantization.QuantType.QUInt8,
                                 op_types_to_quantize=["MatMul", "Gemm", "Conv"])
    model = onnx.load(str(path))
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in init
          and init[n.input[0]].dtype == np.dtype(weight_type)]
    assert len(dq) >= 3
    result = wbfe.score(path, metrics="bfe")
    got = {row["name"]: row for row in result.layers}
    original = {row["name"]: row for row in wbfe.score(net, metrics="bfe").layers}
    module_of = {"/conv/Conv": "conv", "/proj/MatMul": "proj", "/head/Gemm": "head"}
    for node in dq:
        q, scale = init[node.input[0]], init[node.input[1]]
        zero = init[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros_like(q.flat[0])
        axis = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
        if scale.size > 1:  # per channel along axis
            shape = [1] * q.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        decoded = ((q.astype(np.int32) - zero.astype(np.int32)).astype(np.float32) * scale).astype(np.float32)
        row = got[node.input[0]]
        assert row["quant"] == f"onnx-{weight_type}"
        if weight_type == "uint8":
            assert np.any(zero != 0)  # asymmetric: the zero point matters
        (consumer,) = result.model["consumers"][row["name"]]
        param = module_of[consumer.split(" ")[0]] + ".weight"
        w = net.state_dict()[param]
        matrix = torch.from_numpy(decoded.T.copy() if param == "proj.weight" else decoded)  # MatMul: in × out
        assert list(matrix.shape) == list(w.shape) == row["shape"]
        reference = wbfe.score({param: matrix}, metrics="bfe").layers[0]["bfe"]
        assert row["bfe"] == reference, param
        assert row["bfe"] != original[param]["bfe"]
        assert abs(row["bfe"] - original[param]["bfe"]) <= bfe_bound(w.reshape(w.shape[0], -1),
                                                                     matrix.reshape(w.shape[0], -1))
    assert result.summary["head"] == next(n for n, c in result.model["consumers"].items() if "Gemm" in c[0])
    reasons = [s["reason"] for s in result.skipped]
    assert any(r.startswith("consumed: scale of quantised weight") for r in reasons)


# ---- bad input ---------------------------------------------------------------------------------

def _cli(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["score", str(path), "--metrics", "bfe"])
    return result.exit_code, result.stderr


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "data-out-of-range", "data-missing",
                                    "data-outside-folder", "data-absolute", "data-through-symlinked-folder",
                                    "data-offset-not-a-number", "data-length-not-a-number", "duplicate-initializer"])
def test_bad_files_get_a_typed_error_and_exit_2(tmp_path: Path, net: Net, damage: str) -> None:
    path = export(net, tmp_path / "net.onnx", external=damage.startswith("data"))
    expected: type[Exception] = CorruptCheckpointError
    if damage == "truncated":
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        path.write_bytes(bytes(range(256)) * 40)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "data-missing":
        (tmp_path / "net.onnx.data").unlink()
        expected = SourceNotFoundError
    elif damage == "duplicate-initializer":  # found by fuzzing: two initializers of one name were both listed
        model = onnx.load(str(path))
        model.graph.initializer.append(model.graph.initializer[0])
        onnx.save_model(model, str(path))
    else:
        model = onnx.load(str(path), load_external_data=False)
        tensor = next(t for t in model.graph.initializer if t.name == "head.weight")
        for entry in tensor.external_data:
            if damage == "data-out-of-range" and entry.key == "offset":
                entry.value = str((tmp_path / "net.onnx.data").stat().st_size - 8)
            if damage == "data-outside-folder" and entry.key == "location":
                entry.value = "../secret.bin"
            if damage == "data-absolute" and entry.key == "location":
                entry.value = str(tmp_path.parent / "secret.bin")
            if damage == "data-through-symlinked-folder" and entry.key == "location":  # sub -> a folder outside
                entry.value = "sub/secret.bin"
            if damage.endswith("not-a-number") and entry.key == damage.split("-")[1]:  # int() raised, a traceback
                entry.value = "12ab"
        (tmp_path.parent / "secret.bin").write_bytes(b"\0" * 10_000)
        (tmp_path / "sub").symlink_to(tmp_path.parent)
        onnx.save_model(model, str(path))
        expected = TruncatedCheckpointError if damage == "data-out-of-range" else CorruptCheckpointError
    with pytest.raises(expected) as info:
        wbfe.score(path, metrics="bfe")
    assert str(path) in str(info.value)
    code, err = _cli(path)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_external_data_in_a_hub_cache_snapshot(tmp_path: Path, net: Net) -> None:
    """A hub cache's snapshot links each file to its blob outside the snapshot's folder: the model and its
    external data, so linked, score as the same files side by side (they were refused as 'outside the folder')."""
    (tmp_path / "plain").mkdir()
    path = export(net, tmp_path / "plain" / "net.onnx", external=True)
    snapshot, blobs = tmp_path / "hub" / "snapshots" / "abc", tmp_path / "hub" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for name, blob in (("net.onnx", "b1"), ("net.onnx.data", "b2")):
        (blobs / blob).write_bytes((path.parent / name).read_bytes())
        (snapshot / name).symlink_to(Path("..", "..", "blobs", blob))
    want, got = wbfe.score(path, metrics="bfe"), wbfe.score(snapshot / "net.onnx", metrics="bfe")
    assert [(r["name"], r["bfe"]) for r in got.layers] == [(r["name"], r["bfe"]) for r in want.layers]
    assert len(got.layers) == 5 and got.model["files"] == [str(snapshot / "net.onnx"), str(snapshot / "net.onnx.data")]


def test_missing_onnx_package_names_the_extra(tmp_path: Path, net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    path = export(net, tmp_path / "net.onnx")
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'wbfe\[onnx\]'"):
        wbfe.score(path, metrics="bfe")
    code, err = _cli(path)
    assert code == 2 and "pip install 'wbfe[onnx]'" in err


def test_blocked_dequantize_and_transpose_chains(tmp_path: Path) -> None:
    """A graph built with onnx.helper (opset 21): a Gemm weight quantised per block of 32 along its
    input axis with int8 zero points, and a MatMul weight stored out × in behind a Transpose."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(5)
    out, inp, block = 16, 64, 32
    q = rng.integers(-128, 128, size=(out, inp), dtype=np.int8)
    scale = rng.uniform(0.01, 0.1, size=(out, inp // block)).astype(np.float32)
    zero = rng.integers(-5, 6, size=(out, inp // block), dtype=np.int8)
    w2 = rng.standard_normal((24, out)).astype(np.float32)  # out × in, used through Transpose
    nodes = [
        helper.make_node("DequantizeLinear", ["w1_q", "w1_scale", "w1_zero"], ["w1"], name="dq", axis=1,
                         block_size=block),
        helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", transB=1),
        helper.make_node("Transpose", ["w2"], ["w2_t"], name="t", perm=[1, 0]),
        helper.make_node("MatMul", ["h", "w2_t"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, inp])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24])],
        initializer=[numpy_helper.from_array(q, "w1_q"), numpy_helper.from_array(scale, "w1_scale"),
                     numpy_helper.from_array(zero, "w1_zero"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model)
    path = tmp_path / "blocked.onnx"
    onnx.save_model(model, str(path))
    decoded = np.empty((out, inp), dtype=np.float32)
    for r in range(out):
        for c in range(inp):
            decoded[r, c] = np.float32(int(q[r, c]) - int(zero[r, c // block])) * scale[r, c // block]
    got = wbfe.score(path, metrics="bfe")
    rows = {row["name"]: row for row in got.layers}
    want = {row["name"]: row for row in wbfe.score({"w1_q": torch.from_numpy(decoded), "w2": torch.from_numpy(w2)},
                                                   metrics="bfe").layers}
    assert rows["w1_q"]["bfe"] == want["w1_q"]["bfe"] and rows["w1_q"]["quant"] == "onnx-int8"
    assert rows["w2"]["bfe"] == want["w2"]["bfe"] and rows["w2"]["shape"] == [24, out]
    assert got.summary["head"] == "w2"  # the last MatMul before the output
    reasons = {s["name"]: s["reason"] for s in got.skipped}
    assert reasons["w1_scale"].startswith("consumed: scale") and reasons["w1_zero"].startswith("consumed: zero")


def test_an_infinite_nan_or_zero_scale_skips_that_weight_alone_as_in_tflite(tmp_path: Path) -> None:
    """A DequantizeLinear scale that is infinite, NaN (one channel's) or zero gives the weight the operator computes:
    non-finite or all zero, that weight skipped saying so and the rest scored, as TFLite's DEQUANTIZE does
    (tests/test_tflite.py, where a NaN scale refused the whole file)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    q = {f"w{i}": rng.integers(-128, 128, size=(16, 16), dtype=np.int8) for i in range(4)}
    scales = {"w0": np.float32(np.inf), "w1": np.full(16, 0.05, np.float32), "w2": np.float32(0.0),
              "w3": np.full(16, 0.05, np.float32)}
    scales["w1"][3] = np.nan
    nodes, inits, h = [], [], "x"
    for name in q:
        nodes += [helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s"], [name], axis=0),
                  helper.make_node("Gemm", [h, name], [f"{name}_y"], transB=1)]
        inits += [numpy_helper.from_array(q[name], f"{name}_q"), numpy_helper.from_array(scales[name], f"{name}_s")]
        h = f"{name}_y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, 16])], initializer=inits)
    path = tmp_path / "scales.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    result = wbfe.score(path, metrics="bfe")
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    non_finite, all_zero = "non-finite values (NaN or Inf)", "all-zero matrix"  # as tests/test_tflite.py's
    assert [reasons[f"w{i}_q"] for i in range(3)] == [non_finite, non_finite, all_zero]
    alone = wbfe.score({"w3_q": torch.from_numpy(q["w3"] * np.float32(0.05))}, metrics="bfe")
    assert [(r["name"], r["bfe"]) for r in result.layers] == [(r["name"], r["bfe"]) for r in alone.layers]


def test_dequantize_int32_zero_point_does_not_wrap_and_overflow_is_silent_inf() -> None:
    """(q − zero point) was taken in int32, so 2³¹−1 − (−1) wrapped to −2³¹; a product past float32's range
    printed numpy's RuntimeWarning on the terminal (the planner then skips the inf weight as non-finite)."""
    from wbfe.sources.io import dequantize

    q = np.array([[2**31 - 1, 5]], np.int32)
    assert dequantize(q, 1.0, np.array(-1, np.int32), 0).tolist() == [[2.0**31, 6.0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dequantize(np.array([[100, -100, 0]], np.int8), np.float32(3e38), None, 0).tolist() == [
            [np.inf, -np.inf, 0.0]]
        assert np.isnan(dequantize(np.array([[0]], np.int8), np.float32(np.inf), None, 0)).all()


def test_a_float8_dequantize_linear_weight_is_read_as_onnx_computes_it(tmp_path: Path) -> None:
    """The float8 values were cast to integers before scaling (0.8125 -> 0): a garbage matrix, scored. The
    reference is onnx's own ReferenceEvaluator running the graph's DequantizeLinear."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from wbfe.sources import open_source

    rng = np.random.default_rng(7)
    values = rng.standard_normal((16, 32)).astype(np.float32)
    wq = helper.make_tensor("wq", TensorProto.FLOAT8E4M3FN, values.shape, values.ravel().tolist())
    scale = numpy_helper.from_array(np.float32(0.1), "s")
    nodes = [helper.make_node("DequantizeLinear", ["wq", "s"], ["w"]),
             helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [16, 32])],
                              initializer=[wq, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    path = tmp_path / "fp8.onnx"
    onnx.save_model(model, str(path))
    _, expected = ReferenceEvaluator(model).run(None, {"x": np.zeros((1, 32), np.float32)})
    with open_source(path) as source:
        got = {e.name: e for e in source.entries()}["wq"].load()
    assert np.abs(expected).max() > 0 and np.array_equal(got, expected)


@pytest.mark.parametrize("kind", ["INT4", "UINT4"])
def test_a_packed_4_bit_weight_in_external_data_is_read_as_onnx_computes_it(tmp_path: Path, kind: str) -> None:
    """Two 4-bit values a byte: the external data's length was checked against one byte a value (the model refused as
    'out of range') and its bytes would have been viewed unpacked. The reference is onnx's ReferenceEvaluator."""
    import ml_dtypes
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from wbfe.sources import open_source

    rng = np.random.default_rng(8)
    low = -8 if kind == "INT4" else 0
    values = rng.integers(low, low + 16, size=(17, 32)).astype(getattr(ml_dtypes, kind.lower()))  # 544 values
    nodes = [helper.make_node("DequantizeLinear", ["wq", "s"], ["w"]), helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 17])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [17, 32])],
                              initializer=[numpy_helper.from_array(values, "wq"),
                                           numpy_helper.from_array(np.float32(0.05), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    _, expected = ReferenceEvaluator(model).run(None, {"x": np.zeros((1, 17), np.float32)})
    path = tmp_path / "int4.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="int4.data", size_threshold=0)
    stored = onnx.load(str(path), load_external_data=False).graph.initializer[0]
    assert {e.key: e.value for e in stored.external_data}["length"] == "272"  # packed: half a byte a value
    with open_source(path) as source:
        got = {e.name: e for e in source.entries()}["wq"].load()
    assert np.abs(expected).max() > 0 and np.array_equal(got, expected.T)  # MatMul's in x out, reported out x in


def test_external_data_of_a_type_onnx_does_not_know_is_refused_with_exit_2(tmp_path: Path, net: Net) -> None:
    """onnx's KeyError for the type code went out as a traceback (exit 1)."""
    path = export(net, tmp_path / "net.onnx", external=True)
    model = onnx.load(str(path), load_external_data=False)
    model.graph.initializer[0].data_type = 40
    onnx.save_model(model, str(path))
    with pytest.raises(CorruptCheckpointError, match="of data type 40 in external data"):
        wbfe.score(path, metrics="bfe")
    code, err = _cli(path)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_two_initialisers_of_one_name_are_refused(tmp_path: Path) -> None:
    # ONNX values are assigned once: with two stored "w", which one the graph multiplies by is undefined.
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((8, 16)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        initializer=[numpy_helper.from_array(a, "w"), numpy_helper.from_array(b, "w")])
    path = tmp_path / "twice.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    with pytest.raises(CorruptCheckpointError, match=r"malformed ONNX graph \(two stored tensors named 'w'\)$"):
        wbfe.score(path, metrics="bfe")
    result = CliRunner().invoke(app, ["score", str(path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output


@pytest.mark.parametrize("where", ["initializer", "constant"])
def test_a_negative_size_in_a_stored_shape_is_refused(tmp_path: Path, where: str) -> None:
    """A stored shape [-1, 16] was listed as is ("too small: -1 eigenvalue(s)") and read by numpy as "the rest":
    a 64-value tensor came back 4 × 16. ONNX sizes are never negative: the graph is refused when opened."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(1)
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[-1, 16],
                    raw_data=rng.standard_normal(64).astype(np.float32).tobytes())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")]
    if where == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=w))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                              initializer=[w] if where == "initializer" else [])
    path = tmp_path / "negative.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    with pytest.raises(CorruptCheckpointError,
                       match=r"malformed ONNX graph \(tensor 'w' of shape \[-1, 16\]: a negative size\)$"):
        wbfe.score(path, metrics="bfe")
    result = CliRunner().invoke(app, ["score", str(path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output


@pytest.mark.parametrize("damage", ["raw short", "raw long", "float_data short", "scale raw short", "dft-shaped"])
def test_an_initializer_whose_data_does_not_fit_its_shape_is_refused_when_opened(tmp_path: Path, damage: str) -> None:
    """An inline initializer whose data is shorter (or longer) than its shape and data type need was refused only
    when read ("cannot reshape array ..."), after the weights before it were scored, and ``describe`` listed it as a
    matrix. It is refused when the model is opened, as a safetensors or external-data tensor cut short is."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    shape = (16, 9) if damage == "dft-shaped" else (12, 20)  # 9 = 16/2 + 1 outputs: read to see if it is a DFT basis
    first = numpy_helper.from_array(rng.standard_normal((8, shape[0])).astype(np.float32), "w0")
    w = rng.standard_normal(shape).astype(np.float32)
    second = numpy_helper.from_array(w, "w1")
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="fc0")]
    inits = [first, second]
    have, need, unit, name, dims, dtype = 239 * 4, 240 * 4, "bytes", "w1", [12, 20], "float32"
    if damage in ("raw short", "dft-shaped"):
        second.raw_data = second.raw_data[:-4]
        if damage == "dft-shaped":
            have, need, dims = 143 * 4, 144 * 4, [16, 9]
    elif damage == "raw long":
        second.raw_data += bytes(4)
        have = 241 * 4
    elif damage == "float_data short":
        second = TensorProto(name="w1", data_type=TensorProto.FLOAT, dims=[12, 20], float_data=w.reshape(-1)[:-1])
        inits[1] = second
        have, need, unit = 239, 240, "values"
    if damage == "scale raw short":  # an int8 weight whose DequantizeLinear scale (one per output) is cut short
        q = numpy_helper.from_array(rng.integers(-127, 128, (12, 20)).astype(np.int8), "q1")
        scale = numpy_helper.from_array(np.full(20, 0.01, np.float32), "s1")
        scale.raw_data = scale.raw_data[:-4]
        inits = [first, q, scale]
        nodes.append(helper.make_node("DequantizeLinear", ["q1", "s1"], ["w1"], axis=1, name="dq"))
        have, need, name, dims = 19 * 4, 20 * 4, "s1", [20]
    nodes.append(helper.make_node("MatMul", ["h", "w1"], ["y"], name="fc1"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dims[-1]])],
                              initializer=inits)
    path = tmp_path / "short.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    want = (f"{path}: initializer {name!r} holds {have} {unit} of data, its shape {dims} of {dtype} needs {need}: "
            "a damaged model; export it again")
    for call in (wbfe.describe, wbfe.score):  # describe reads no tensor: the refusal comes when the model is opened
        with pytest.raises(CorruptCheckpointError) as caught:
            call(path)
        assert str(caught.value) == want
    result = CliRunner().invoke(app, ["score", str(path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
