"""Recurrent weights in ONNX graphs (wbfe/sources/onnx_graph.py): torch's exporter feeds an LSTM/GRU
its W and R either as folded [directions, gates·hidden, in] initializers or, without constant
folding, through Slice/Concat/Unsqueeze chains from the module's own parameters. Either way each
direction's stacked gate matrix is scored, and the values read equal the torch module's weights
(reordered into ONNX's gate order where the exporter folded them: the ONNX operator spec's order,
independent of wbfe)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import wbfe
from wbfe.sources import open_source

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

HIDDEN, INPUT = 6, 5
# ONNX stacks LSTM gates i, o, f, c and GRU gates z, r, h; torch stacks i, f, g, o and r, z, n.
ONNX_ORDER = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2)}


class _Net(torch.nn.Module):
    def __init__(self, kind: str, bidirectional: bool):
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(INPUT, HIDDEN, batch_first=True, bidirectional=bidirectional)
        self.fc = torch.nn.Linear(HIDDEN * (2 if bidirectional else 1), 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


def _export(tmp_path: Path, kind: str, bidirectional: bool, fold: bool) -> tuple[_Net, Path]:
    torch.manual_seed(3)
    net = _Net(kind, bidirectional).eval()
    path = tmp_path / f"{kind}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(1, 4, INPUT),), str(path), dynamo=False, do_constant_folding=fold)
    return net, path


def _onnx_order(weight: torch.Tensor, kind: str) -> np.ndarray:
    gates = weight.detach().numpy().reshape(len(ONNX_ORDER[kind]), HIDDEN, -1)
    return np.concatenate([gates[g] for g in ONNX_ORDER[kind]])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_sliced_and_concatenated_parameters_are_the_recurrent_matrices(tmp_path: Path, kind: str,
                                                                      bidirectional: bool) -> None:
    net, path = _export(tmp_path, kind, bidirectional, fold=False)
    params = dict(net.rnn.named_parameters())
    with open_source(path) as source:
        entries = {e.name: e for e in source.entries()}
        for suffix in ["", "_reverse"] if bidirectional else [""]:
            for which in ("ih", "hh"):
                name = f"rnn.weight_{which}_l0{suffix}"
                entry = entries[name]
                assert entry.skip is None and entry.shape == tuple(params[f"weight_{which}_l0{suffix}"].shape)
                np.testing.assert_array_equal(np.asarray(entry.load()), params[f"weight_{which}_l0{suffix}"].detach().numpy())
                assert entries[f"rnn.bias_{which}_l0{suffix}"].skip.startswith("bias (consumed by")
                assert f"({kind}) input 3" in entries[f"rnn.bias_{which}_l0{suffix}"].skip
    result = wbfe.score(path, metrics="bfe")
    scored = [row["name"] for row in result.layers]
    assert "rnn.weight_ih_l0" in scored and "rnn.weight_hh_l0" in scored
    assert all(np.isfinite(row["bfe"]) for row in result.layers)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_folded_operands_are_one_stacked_matrix_per_direction(tmp_path: Path, kind: str, bidirectional: bool) -> None:
    net, path = _export(tmp_path, kind, bidirectional, fold=True)
    params = dict(net.rnn.named_parameters())
    with open_source(path) as source:
        weights = [e for e in source.entries() if e.skip is None and e.name != "fc.weight"]
    suffixes = ["", "_reverse"] if bidirectional else [""]
    expected = [_onnx_order(params[f"weight_{which}_l0{s}"], kind) for which in ("ih", "hh") for s in suffixes]
    assert len(weights) == len(expected)
    for entry, want in zip(weights, expected):
        assert entry.name.endswith(("[0]", "[1]")) == bidirectional
        assert entry.shape == want.shape
        np.testing.assert_array_equal(np.asarray(entry.load()), want)
    # a row order never changes a spectrum: the folded file scores what the module's parameters score
    (tmp_path / "u").mkdir()
    _, unfolded = _export(tmp_path / "u", kind, bidirectional, fold=False)

    def recurrent(onnx_file: Path) -> list[float]:
        return sorted(row["bfe"] for row in wbfe.score(onnx_file, metrics="bfe").layers if row["name"] != "fc.weight")

    assert recurrent(path) == pytest.approx(recurrent(unfolded), rel=1e-9)


def _lstm_graph(w_node_input: str, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> onnx.GraphProto:
    lstm = helper.make_node("LSTM", ["x", w_node_input, "r"], ["y"], name="/lstm", hidden_size=HIDDEN)
    return helper.make_graph(nodes + [lstm], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, INPUT])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1, 1, HIDDEN])], inits)


def test_a_transposed_kernel_sliced_into_gates_is_read_out_by_in(tmp_path: Path) -> None:
    """A Keras-style kernel stored in × 4·hidden, transposed, sliced into its gates and stacked in
    another order: the stored matrix, out × in (its transpose), is what is scored."""
    rng = np.random.default_rng(5)
    kernel = rng.standard_normal((INPUT, 4 * HIDDEN)).astype(np.float32)
    recurrent = rng.standard_normal((1, 4 * HIDDEN, HIDDEN)).astype(np.float32)
    ints = {n: numpy_helper.from_array(np.array(v, dtype=np.int64), n)
            for n, v in [("s0", [0]), ("s1", [HIDDEN]), ("s2", [2 * HIDDEN]), ("s4", [4 * HIDDEN]), ("ax", [0])]}
    nodes = [helper.make_node("Transpose", ["kernel"], ["kt"], name="t", perm=[1, 0]),
             helper.make_node("Slice", ["kt", "s0", "s1", "ax"], ["i"], name="sl_i"),
             helper.make_node("Slice", ["kt", "s1", "s2", "ax"], ["f"], name="sl_f"),
             helper.make_node("Slice", ["kt", "s2", "s4", "ax"], ["co"], name="sl_co"),
             helper.make_node("Split", ["co"], ["c", "o"], name="split", axis=0, num_outputs=2),
             helper.make_node("Concat", ["i", "o", "f", "c"], ["w2"], name="cat", axis=0),
             helper.make_node("Unsqueeze", ["w2", "ax"], ["w"], name="unsq")]
    inits = [numpy_helper.from_array(kernel, "kernel"), numpy_helper.from_array(recurrent, "r"), *ints.values()]
    model = helper.make_model(_lstm_graph("w", nodes, inits), opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    with open_source(path) as source:
        entries = {e.name: e for e in source.entries()}
    assert entries["kernel"].skip is None and entries["kernel"].shape == (4 * HIDDEN, INPUT)
    np.testing.assert_array_equal(np.asarray(entries["kernel"].load()), kernel.T)
    assert entries["r"].skip is None and entries["r"].shape == (4 * HIDDEN, HIDDEN)
    np.testing.assert_array_equal(np.asarray(entries["r"].load()), recurrent[0])
    assert all(entries[n].skip is not None for n in ints)


def test_an_operand_that_cannot_be_the_gates_is_skipped_saying_why(tmp_path: Path) -> None:
    wrong = np.ones((1, 3 * HIDDEN, INPUT), dtype=np.float32)  # 3 gates for an LSTM's 4
    flat = np.ones((4 * HIDDEN, INPUT), dtype=np.float32)  # 2-D straight into W: not an LSTM operand
    inits = [numpy_helper.from_array(wrong, "w"), numpy_helper.from_array(flat, "r")]
    graph = _lstm_graph("w", [], inits)
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    with open_source(path) as source:
        entries = {e.name: e for e in source.entries()}
    assert entries["w"].skip == ("1x18x5 operand of /lstm (LSTM) W does not fit 1 direction(s) of 4 gate(s) of "
                                 "hidden_size 6: wbfe cannot tell its layout")
    assert entries["r"].skip == "2-D operand of /lstm (LSTM) R (wbfe reads [directions, gates·hidden, in])"


def test_a_quantised_recurrent_operand_is_dequantised_per_direction(tmp_path: Path) -> None:
    """int8 W [2, 4·hidden, in] with one scale per direction (axis 0) behind DequantizeLinear: each
    direction is (q − zero point)·scale, as the operator computes it."""
    rng = np.random.default_rng(7)
    q = rng.integers(-127, 128, size=(2, 4 * HIDDEN, INPUT)).astype(np.int8)
    scale = np.array([0.02, 0.05], dtype=np.float32)
    zero = np.array([3, -2], dtype=np.int8)
    recurrent = rng.standard_normal((2, 4 * HIDDEN, HIDDEN)).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="dq", axis=0)]
    inits = [numpy_helper.from_array(q, "w_q"), numpy_helper.from_array(scale, "w_scale"),
             numpy_helper.from_array(zero, "w_zero"), numpy_helper.from_array(recurrent, "r")]
    lstm = helper.make_node("LSTM", ["x", "w", "r"], ["y"], name="/lstm", hidden_size=HIDDEN, direction="bidirectional")
    graph = helper.make_graph(nodes + [lstm], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, INPUT])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2, 1, HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    with open_source(path) as source:
        entries = {e.name: e for e in source.entries()}
    for d in (0, 1):
        entry = entries[f"w_q[{d}]"]
        assert entry.skip is None and entry.quant == "onnx-int8" and entry.shape == (4 * HIDDEN, INPUT)
        want = (q[d].astype(np.float32) - zero[d]) * scale[d]
        np.testing.assert_array_equal(np.asarray(entry.load()), want)
        np.testing.assert_array_equal(np.asarray(entries[f"r[{d}]"].load()), recurrent[d])
    assert entries["w_scale"].skip.startswith("consumed: scale of quantised weight w_q")


@pytest.mark.parametrize("attrs", [{"hidden_size": HIDDEN, "direction": "forward"}, {"direction": "bidirectional"}])
def test_directions_must_match_and_a_missing_hidden_size_is_no_crash(tmp_path: Path, attrs: dict[str, object]) -> None:
    """Two stored directions for a forward LSTM are skipped; without hidden_size (nothing to check
    the rows against) a bidirectional W and an R sliced into place are read, not divided by zero."""
    w = np.ones((2, 4 * HIDDEN, INPUT), dtype=np.float32)
    sliced = np.ones((2, 4 * HIDDEN, HIDDEN), dtype=np.float32)
    ints = [numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in [("s0", [0]), ("s2", [2]), ("ax", [0])]]
    nodes = [helper.make_node("Slice", ["r2", "s0", "s2", "ax"], ["r"], name="sl"),
             helper.make_node("LSTM", ["x", "w", "r"], ["y"], name="/lstm", **attrs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, INPUT])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(sliced, "r2"), *ints])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    with open_source(path) as source:
        entries = {e.name: e for e in source.entries()}
    if "hidden_size" in attrs:
        assert entries["w"].skip == ("2x24x5 operand of /lstm (LSTM) W does not fit 1 direction(s) of 4 gate(s) of "
                                     "hidden_size 6: wbfe cannot tell its layout")
    else:
        assert [entries[n].skip for n in ("w[0]", "w[1]", "r2[0]", "r2[1]")] == [None] * 4
