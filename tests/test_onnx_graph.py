"""Weights wherever a real-world ONNX graph keeps them (wbfe/sources/onnx_graph.py): Constant nodes
and their value_float(s)/value_int(s) forms, If branches sharing a weight, nested Loop bodies, a Scan
body, chains of Identity/Cast/Transpose, signal-processing constants skipped; the model's order and the head from the graph. Every graph is built with
onnx.helper from seeded float arrays, and every value read is compared with the array it was built
from (transposed where the consuming operator says so)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import wbfe
from wbfe.linalg.arrays import to_torch
from wbfe.sources import open_source

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(11)
W_IN = RNG.standard_normal((4, 6)).astype(np.float32)  # a MatMul B: in × out
W_OUT = RNG.standard_normal((3, 6)).astype(np.float32)  # a Gemm B with transB: out × in
W_HALF = RNG.standard_normal((5, 4)).astype(np.float16)  # out × in, behind Cast and Transpose
W_DEEP = RNG.standard_normal((6, 6)).astype(np.float32)  # in × out, two subgraphs deep


def _info(name: str, shape: list[int], kind: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, kind, shape)


def _save(tmp_path: Path, graph: onnx.GraphProto, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    return path


def _read(path: Path) -> tuple[dict[str, object], object]:
    with open_source(path) as source:
        entries = list(source.entries())
        return {e.name: e for e in entries}, source


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}_node", value=numpy_helper.from_array(array, name))


def test_constant_nodes_hold_weights_and_value_floats_are_read(tmp_path: Path) -> None:
    nodes = [
        _const("w_in", W_IN),
        helper.make_node("MatMul", ["x", "w_in"], ["h"], name="fc1"),
        helper.make_node("Constant", [], ["shift"], name="shift_node", value_floats=[0.5] * 6),
        helper.make_node("Constant", [], ["axes"], name="axes_node", value_ints=[0]),  # plumbing: not listed
        helper.make_node("Add", ["h", "shift"], ["h2"], name="add"),
        helper.make_node("Unsqueeze", ["h2", "axes"], ["h3"], name="unsq"),
        _const("w_out", W_OUT),
        helper.make_node("Gemm", ["h2", "w_out"], ["y"], name="fc2", transB=1),
    ]
    graph = helper.make_graph(nodes, "g", [_info("x", [1, 4])], [_info("y", [1, 3]), _info("h3", [1, 1, 6])])
    entries, source = _read(_save(tmp_path, graph))
    assert list(entries) == ["w_in", "w_out"]  # the 1-D constants are plumbing, not tensors of the model
    assert torch.equal(to_torch(entries["w_in"].load()), torch.from_numpy(W_IN.T.copy()))
    assert entries["w_in"].shape == (6, 4)
    assert torch.equal(to_torch(entries["w_out"].load()), torch.from_numpy(W_OUT))
    assert source.head_hint == "w_out"
    assert source.provenance.extra["consumers"] == {"w_in": ["fc1 (MatMul)"], "w_out": ["fc2 (Gemm)"]}


def test_value_floats_reaching_a_matmul_is_listed_and_skipped(tmp_path: Path) -> None:
    nodes = [helper.make_node("Constant", [], ["v"], name="v_node", value_floats=[1.0, 2.0, 3.0, 4.0]),
             helper.make_node("MatMul", ["x", "v"], ["y"], name="dot")]
    entries, _ = _read(_save(tmp_path, helper.make_graph(nodes, "g", [_info("x", [2, 4])], [_info("y", [2])])))
    assert entries["v"].skip == "1-D MatMul operand (batched weights are not read)"


def _branch(name: str, weight: str, out: str) -> onnx.GraphProto:
    """A branch computing x @ weight, where weight and x come from the outer scope."""
    return helper.make_graph([helper.make_node("MatMul", ["x", weight], [out], name=f"{name}_mm")], name, [],
                             [_info(out, [1, 6])])


def test_if_branches_sharing_a_weight_list_it_once(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("If", ["cond"], ["h"], name="choose",
                         then_branch=_branch("then", "w_in", "a"), else_branch=_branch("else", "w_in", "b")),
        helper.make_node("Gemm", ["h", "w_out"], ["y"], name="head", transB=1),
    ]
    inputs = [_info("cond", [], TensorProto.BOOL), _info("x", [1, 4])]
    graph = helper.make_graph(nodes, "g", inputs, [_info("y", [1, 3])],
                              [numpy_helper.from_array(W_OUT, "w_out"), numpy_helper.from_array(W_IN, "w_in")])
    entries, source = _read(_save(tmp_path, graph))
    assert list(entries) == ["w_in", "w_out"]  # the model's order (w_in's branches come first), stored order reversed
    assert torch.equal(to_torch(entries["w_in"].load()), torch.from_numpy(W_IN.T.copy()))
    assert source.provenance.extra["consumers"]["w_in"] == ["then_mm (MatMul)", "else_mm (MatMul)"]
    assert source.head_hint == "w_out"
    # scored once, not once per branch
    result = wbfe.score(tmp_path / "g.onnx", metrics="bfe")
    assert [row["name"] for row in result.layers] == ["w_in", "w_out"]


def test_head_found_inside_the_branches_an_output_comes_from(tmp_path: Path) -> None:
    nodes = [helper.make_node("If", ["cond"], ["y"], name="choose",
                              then_branch=_branch("then", "w_in", "a"), else_branch=_branch("else", "w_in", "b"))]
    inputs = [_info("cond", [], TensorProto.BOOL), _info("x", [1, 4])]
    graph = helper.make_graph(nodes, "g", inputs, [_info("y", [1, 6])],
                              [numpy_helper.from_array(W_IN, "w_in")])
    _, source = _read(_save(tmp_path, graph))
    assert source.head_hint == "w_in"


def test_weight_two_subgraphs_deep_in_a_loop_and_an_if(tmp_path: Path) -> None:
    """Loop body -> If then-branch -> a Constant weight used by a MatMul on the loop-carried state."""
    inner_then = helper.make_graph([_const("w_deep", W_DEEP),
                                    helper.make_node("MatMul", ["s_in", "w_deep"], ["t"], name="deep_mm")],
                                   "then", [], [_info("t", [1, 6])])
    inner_else = helper.make_graph([helper.make_node("Identity", ["s_in"], ["e"], name="keep")], "else", [],
                                   [_info("e", [1, 6])])
    body = helper.make_graph(
        [helper.make_node("If", ["cond_in"], ["s_out"], name="inner_if", then_branch=inner_then,
                          else_branch=inner_else),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond_id")],
        "body", [_info("i", [], TensorProto.INT64), _info("cond_in", [], TensorProto.BOOL), _info("s_in", [1, 6])],
        [_info("cond_out", [], TensorProto.BOOL), _info("s_out", [1, 6])])
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["s0"], name="fc1"),
             helper.make_node("Loop", ["trips", "cond", "s0"], ["y"], name="loop", body=body)]
    graph = helper.make_graph(nodes, "g", [_info("x", [1, 4]), _info("trips", [], TensorProto.INT64),
                                           _info("cond", [], TensorProto.BOOL)], [_info("y", [1, 6])],
                              [numpy_helper.from_array(W_IN, "w_in")])
    entries, source = _read(_save(tmp_path, graph))
    assert list(entries) == ["w_in", "w_deep"]
    assert torch.equal(to_torch(entries["w_deep"].load()), torch.from_numpy(W_DEEP.T.copy()))
    assert source.provenance.extra["consumers"]["w_deep"] == ["deep_mm (MatMul)"]


def test_weight_behind_identity_cast_and_transpose(tmp_path: Path) -> None:
    nodes = [helper.make_node("Identity", ["w_half"], ["w1"], name="id"),
             helper.make_node("Cast", ["w1"], ["w2"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Transpose", ["w2"], ["w3"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["x", "w3"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "g", [_info("x", [1, 4])], [_info("y", [1, 5])],
                              [numpy_helper.from_array(W_HALF, "w_half")])
    entries, source = _read(_save(tmp_path, graph))
    entry = entries["w_half"]
    assert entry.shape == (5, 4) and entry.dtype == "float16"
    assert torch.equal(to_torch(entry.load()), torch.from_numpy(W_HALF))  # out × in as stored: the Transpose undoes MatMul's
    assert source.head_hint == "w_half"


def test_signal_constants_and_positional_tables_are_skipped_never_the_head(tmp_path: Path) -> None:
    n_fft = 8
    k, n = np.meshgrid(np.arange(n_fft // 2 + 1), np.arange(n_fft), indexing="ij")
    basis = np.concatenate([np.cos(2 * np.pi * k * n / n_fft), -np.sin(2 * np.pi * k * n / n_fft)])
    basis = basis.astype(np.float32)[:, None, :]  # (2·bins, 1, n_fft): a Conv1d weight
    positions = RNG.standard_normal((10, 10)).astype(np.float32)
    nodes = [_const("stft_forward_basis", basis),
             helper.make_node("Conv", ["audio", "stft_forward_basis"], ["spec"], name="/stft/Conv", strides=[n_fft]),
             helper.make_node("Flatten", ["spec"], ["flat"], name="flat"),
             helper.make_node("Add", ["flat", "pos_table"], ["z"], name="add_pos"),
             helper.make_node("Gemm", ["z", "w_out"], ["y"], name="head", transB=1)]
    graph = helper.make_graph(nodes, "g", [_info("audio", [1, 1, 40])], [_info("y", [1, 3])],
                              [numpy_helper.from_array(positions, "pos_table"),
                               numpy_helper.from_array(RNG.standard_normal((3, 10)).astype(np.float32), "w_out")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))  # shapes deliberately not checked: only the graph's structure matters here
    entries, source = _read(path)
    assert entries["stft_forward_basis"].skip.startswith("signal-processing constant (stft")
    assert entries["pos_table"].skip == "not a weight input (consumed by add_pos (Add) input 1)"
    assert source.head_hint == "w_out"
    result = wbfe.score(path, metrics="bfe")
    assert [row["name"] for row in result.layers] == ["w_out"] and result.summary["head"] == "w_out"


def test_same_name_in_two_branches_is_qualified(tmp_path: Path) -> None:
    """Each branch stores its own Constant named ``w``: two tensors, named by their scope."""
    a, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((4, 6)).astype(np.float32)

    def branch(name: str, array: np.ndarray, out: str) -> onnx.GraphProto:
        nodes = [_const("w", array), helper.make_node("MatMul", ["x", "w"], [out], name=f"{name}_mm")]
        return helper.make_graph(nodes, name, [], [_info(out, [1, 6])])

    nodes = [helper.make_node("If", ["cond"], ["y"], name="choose", then_branch=branch("then", a, "p"),
                              else_branch=branch("else", b, "q"))]
    inputs = [_info("cond", [], TensorProto.BOOL), _info("x", [1, 4])]
    graph = helper.make_graph(nodes, "g", inputs, [_info("y", [1, 6])])
    entries, _ = _read(_save(tmp_path, graph))
    assert list(entries) == ["choose/then_branch/w", "choose/else_branch/w"]
    assert torch.equal(to_torch(entries["choose/then_branch/w"].load()), torch.from_numpy(a.T.copy()))
    assert torch.equal(to_torch(entries["choose/else_branch/w"].load()), torch.from_numpy(b.T.copy()))


def _dft_basis(n_fft: int, window: np.ndarray) -> np.ndarray:
    """[cos; -sin] rows of the real DFT for k = 0..n/2, times the window: (2·bins) × n."""
    k, t = np.meshgrid(np.arange(n_fft // 2 + 1), np.arange(n_fft), indexing="ij")
    angle = 2 * np.pi * k * t / n_fft
    return (np.concatenate([np.cos(angle), -np.sin(angle)]) * window).astype(np.float32)


def test_a_dft_basis_is_found_by_its_values_whatever_its_name(tmp_path: Path) -> None:
    """torch.stft exported as a Conv1d over a Hann-windowed basis named onnx::Conv_7, and the same
    basis as a MatMul operand (stored n × 2·bins); a random Conv1d weight of the same shape is read."""
    from wbfe.sources.onnx_graph import is_dft_basis

    n_fft = 16
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    basis = _dft_basis(n_fft, hann)
    random = RNG.standard_normal(basis.shape).astype(np.float32)
    nodes = [helper.make_node("Conv", ["audio", "onnx::Conv_7"], ["spec"], name="/Conv", strides=[n_fft]),
             helper.make_node("Conv", ["audio", "learned"], ["feat"], name="/Conv_1", strides=[n_fft]),
             helper.make_node("MatMul", ["frames", "onnx::MatMul_9"], ["spec2"], name="/MatMul")]
    graph = helper.make_graph(
        nodes, "g", [_info("audio", [1, 1, 64]), _info("frames", [4, n_fft])],
        [_info("spec", [1, 18, 4]), _info("feat", [1, 18, 4]), _info("spec2", [4, 18])],
        [numpy_helper.from_array(basis[:, None, :], "onnx::Conv_7"),
         numpy_helper.from_array(random[:, None, :], "learned"),
         numpy_helper.from_array(basis.T.copy(), "onnx::MatMul_9")])
    entries, _ = _read(_save(tmp_path, graph))
    for name in ("onnx::Conv_7", "onnx::MatMul_9"):
        assert entries[name].skip.startswith("signal-processing constant (a windowed DFT basis"), name
    assert entries["learned"].skip is None
    assert torch.equal(to_torch(entries["learned"].load()), torch.from_numpy(random[:, None, :]))
    # the check itself: a rectangular window and the cosine half alone are bases too; a perturbed one is not
    assert is_dft_basis(_dft_basis(n_fft, np.ones(n_fft))) and is_dft_basis(basis[: n_fft // 2 + 1])
    perturbed = basis.copy()
    perturbed[5, 3] += 0.01
    assert not is_dft_basis(perturbed)


@pytest.mark.parametrize("attr, value, kind", [
    ("value_float", 2.5, TensorProto.FLOAT), ("value_floats", [1.0, -2.0, 0.25, 4.0], TensorProto.FLOAT),
    ("value_int", 3, TensorProto.INT64), ("value_ints", [7, -1, 0, 2], TensorProto.INT64)])
def test_constant_value_forms_load_the_values_onnx_gives_and_are_skipped_as_no_matrix(
        tmp_path: Path, attr: str, value: object, kind: int) -> None:
    from onnx.reference import ReferenceEvaluator

    nodes = [helper.make_node("Constant", [], ["v"], name="v_node", **{attr: value}),
             helper.make_node("MatMul", ["x", "v"], ["y"], name="dot")]
    graph = helper.make_graph(nodes, "g", [_info("x", [2, 4], kind)], [_info("y", [2], kind), _info("v", list(np.shape(value)), kind)])
    path = _save(tmp_path, graph)
    # onnx's own reference runtime evaluates the Constant node: the independent value.
    (expected,) = ReferenceEvaluator(str(path)).run(["v"], {"x": np.zeros((2, 4), dtype=helper.tensor_dtype_to_np_dtype(kind))})
    assert np.array_equal(expected, np.asarray(value))
    entries, _ = _read(path)
    entry = entries["v"]
    loaded = np.asarray(entry.load())
    assert loaded.dtype == expected.dtype and loaded.shape == expected.shape == entry.shape
    assert np.array_equal(loaded, expected)
    # Neither a scalar nor a vector is a matrix: listed, skipped with the reason.
    ndim = np.ndim(value)
    assert entry.skip == f"{ndim}-D MatMul operand (batched weights are not read)"
    (row,) = [r for r in wbfe.describe(str(path)).skipped if r["name"] == "v"]
    assert row["reason"] == entry.skip


W_SCAN = RNG.standard_normal((4, 6)).astype(np.float32)  # in × out, an outer initializer used in a Scan body
W_STEP = RNG.standard_normal((6, 6)).astype(np.float32)  # in × out, a Constant inside the body


def test_weights_inside_a_scan_body_are_read_and_listed_once(tmp_path: Path) -> None:
    """Scan over the rows of x: s ← s @ W_STEP + x_t @ W_SCAN; W_SCAN is used again after the Scan."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "w_scan"], ["p"], name="scan_in_mm"),
         _const("w_step", W_STEP),
         helper.make_node("MatMul", ["s_in", "w_step"], ["q"], name="scan_step_mm"),
         helper.make_node("Add", ["p", "q"], ["s_out"], name="scan_add"),
         helper.make_node("Identity", ["s_out"], ["y_t"], name="scan_out")],
        "body", [_info("s_in", [6]), _info("x_t", [4])], [_info("s_out", [6]), _info("y_t", [6])])
    nodes = [helper.make_node("Scan", ["s0", "x"], ["s_last", "ys"], name="scan", body=body, num_scan_inputs=1),
             helper.make_node("MatMul", ["x", "w_scan"], ["z"], name="direct_mm")]
    graph = helper.make_graph(nodes, "g", [_info("s0", [6]), _info("x", [3, 4])],
                              [_info("s_last", [6]), _info("ys", [3, 6]), _info("z", [3, 6])],
                              [numpy_helper.from_array(W_SCAN, "w_scan")])
    path = _save(tmp_path, graph)
    from onnx.reference import ReferenceEvaluator

    x = RNG.standard_normal((3, 4)).astype(np.float32)
    s = np.zeros(6, dtype=np.float32)
    for row in x:  # the recurrence the graph computes, by hand: the graph is the one described
        s = s @ W_STEP + row @ W_SCAN
    (last,) = ReferenceEvaluator(str(path)).run(["s_last"], {"s0": np.zeros(6, dtype=np.float32), "x": x})
    assert np.allclose(last, s, rtol=1e-5)
    entries, source = _read(path)
    assert sorted(entries) == ["w_scan", "w_step"]  # w_scan used in the body and outside: once
    assert torch.equal(to_torch(entries["w_scan"].load()), torch.from_numpy(W_SCAN.T.copy()))
    assert torch.equal(to_torch(entries["w_step"].load()), torch.from_numpy(W_STEP.T.copy()))
    assert sorted(source.provenance.extra["consumers"]["w_scan"]) == ["direct_mm (MatMul)", "scan_in_mm (MatMul)"]
    described = wbfe.describe(str(path))
    assert sorted(m["name"] for m in described.matrices) == ["w_scan", "w_step"]


def test_a_sparse_initializer_is_listed_as_skipped_and_is_not_passed_over_for_the_head(tmp_path: Path) -> None:
    """graph.sparse_initializer (which onnxruntime runs) was not read at all: the sparse weight was neither scored nor
    listed, and the MatMul before it was named the head from the graph."""
    dense = np.where(RNG.standard_normal((6, 3)) > 0.5, RNG.standard_normal((6, 3)), 0).astype(np.float32)
    at = np.flatnonzero(dense)
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(dense.ravel()[at], "w_head"),
                                       numpy_helper.from_array(at.astype(np.int64), "w_head_at"), [6, 3])
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h"]), helper.make_node("MatMul", ["h", "w_head"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_info("x", [1, 4])], [_info("y", [1, 3])],
                              [numpy_helper.from_array(W_IN, "w_in")], sparse_initializer=[sparse])
    with open_source(_save(tmp_path, graph)) as source:
        entries = {e.name: e for e in source.entries()}
        assert source.head_hint is None
    assert entries["w_in"].skip is None and np.array_equal(to_torch(entries["w_in"].load()).numpy(), W_IN.T)
    assert entries["w_head"].skip == "sparse initializer: wbfe reads dense weights only"
    assert entries["w_head"].shape == (6, 3) and entries["w_head"].dtype == "float32"
