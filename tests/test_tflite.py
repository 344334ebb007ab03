"""TFLite models (wbfe.sources.tflite_files): files written field by field from TFLite's schema
(tests/tflite_writer.py, checked against the ``tflite`` package's own accessors), weights read in
PyTorch's layout, dequantisation checked against an independent numpy implementation, float and
int8 twins, and hostile files refused with a typed error."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import wbfe
from tests import tflite_writer as tw
from wbfe.errors import CorruptCheckpointError, WbfeError
from wbfe.linalg.arrays import to_torch
from wbfe.sources import open_source
from wbfe.sources.registry import format_of

tflite = pytest.importorskip("tflite")

WEIGHTS = ("conv", "depthwise", "fc1", "fc2")
# How a weight stored in TFLite's layout becomes PyTorch's [out, in, k...] (written out by hand,
# not taken from the reader).
TO_TORCH = {"conv": (0, 3, 1, 2), "depthwise": (3, 0, 1, 2), "fc1": (0, 1), "fc2": (0, 1)}
VARIANTS = ("float32", "int8", "uint8", "int16", "float16")
# What the scoring says of a matrix with a NaN or an infinity, and of one of zeros (wbfe.linalg.spectra).
NON_FINITE, ALL_ZERO = "non-finite values (NaN or Inf)", "all-zero matrix"


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return tw.random_weights(seed=0)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, weights: dict[str, np.ndarray]) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tflite")
    out = {v: tw.write(folder / f"model_{v}.tflite", tw.twin_graph(weights, v)) for v in VARIANTS}
    out["int8-external"] = tw.write(folder / "model_int8_external.tflite", tw.twin_graph(weights, "int8"), external=True)
    return out


def _matrices(path: Path) -> dict[str, torch.Tensor]:
    with open_source(path) as source:
        return {e.name: to_torch(e.load()) for e in source.entries() if e.skip is None}


# ---- the writer follows the schema: the tflite package's own accessors read it back ------------


@pytest.mark.parametrize("variant", VARIANTS + ("int8-external",))
def test_the_writer_output_reads_with_the_tflite_accessors(models: dict[str, Path], weights: dict[str, np.ndarray],
                                                           variant: str) -> None:
    raw = models[variant].read_bytes()
    assert tflite.Model.ModelBufferHasIdentifier(raw, 0)
    model = tflite.Model.GetRootAs(raw, 0)
    sg = model.Subgraphs(0)
    codes = [tflite.utils.BUILTIN_OPCODE2NAME[model.OperatorCodes(sg.Operators(k).OpcodeIndex()).BuiltinCode()]
             for k in range(sg.OperatorsLength())]
    expected_ops = ["CONV_2D", "DEPTHWISE_CONV_2D", "RESHAPE", "FULLY_CONNECTED", "FULLY_CONNECTED", "SOFTMAX"]
    if variant == "float16":
        expected_ops = ["DEQUANTIZE", "CONV_2D", "DEQUANTIZE", "DEPTHWISE_CONV_2D", "DEQUANTIZE", "RESHAPE",
                        "FULLY_CONNECTED", "DEQUANTIZE", "FULLY_CONNECTED", "SOFTMAX"]
    assert codes == expected_ops
    weight_ops = [sg.Operators(k) for k, c in enumerate(codes) if c in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")]
    for key, op in zip(WEIGHTS, weight_ops):
        t_index = op.Inputs(1)
        if variant == "float16":  # the weight input is the DEQUANTIZE's output
            producer = next(sg.Operators(k) for k in range(sg.OperatorsLength()) if sg.Operators(k).Outputs(0) == t_index)
            t_index = producer.Inputs(0)
        tensor = sg.Tensors(t_index)
        assert tuple(tensor.ShapeAsNumpy()) == weights[key].shape
        buffer = model.Buffers(tensor.Buffer())
        if variant == "int8-external":
            assert buffer.DataIsNone() and buffer.Offset() > 1
            data = np.frombuffer(raw, np.uint8, count=buffer.Size(), offset=buffer.Offset())
        else:
            data = buffer.DataAsNumpy()
        stored = data.view(_stored_dtype(tensor.Type())).reshape(weights[key].shape)
        q = tensor.Quantization()
        if variant in ("float32", "float16"):
            assert np.array_equal(stored.astype(np.float32), weights[key].astype(stored.dtype).astype(np.float32))
        else:  # the written integers are the weights to within half a step of their scale
            scale, zero = q.ScaleAsNumpy(), q.ZeroPointAsNumpy()
            axis = q.QuantizedDimension()
            shape = [1] * stored.ndim
            if scale.size > 1:
                shape[axis] = -1
            real = (stored.astype(np.float64) - zero.reshape(shape)) * scale.reshape(shape)
            assert np.all(np.abs(real - weights[key]) <= scale.reshape(shape) / 2 * (1 + 1e-5))


def _stored_dtype(code: int) -> np.dtype:
    return np.dtype({0: "<f4", 1: "<f2", 3: "u1", 7: "<i2", 9: "i1"}[code])


# ---- reading --------------------------------------------------------------------------------------


def test_a_float_model_reads_as_its_weights_in_pytorchs_layout(models: dict[str, Path],
                                                               weights: dict[str, np.ndarray]) -> None:
    assert format_of(models["float32"]).name == "tflite"
    with open_source(models["float32"]) as source:
        entries = list(source.entries())
        got = {e.name: to_torch(e.load()) for e in entries if e.skip is None}
        description = source.description
        assert source.provenance.format == "tflite"
    names = ["model/conv/Conv2D", "model/depthwise/depthwise", "model/hidden/MatMul", "model/out/MatMul"]
    assert list(got) == names  # the graph's order
    for key, name in zip(WEIGHTS, names):
        expected = torch.from_numpy(weights[key].transpose(TO_TORCH[key]).copy())
        assert got[name].dtype == torch.float32 and torch.equal(got[name], expected), name
    # every constant is accounted for: the 4 biases and the reshape's shape are listed, with why
    skipped = {e.name: e.skip for e in entries if e.skip is not None}
    assert len(skipped) == 5
    assert sum(reason.startswith("bias (consumed by ") for reason in skipped.values()) == 4
    assert skipped["model/flatten/Const"].startswith("not a weight input (consumed by RESHAPE")
    assert description is not None and description.framework == "tflite"
    assert description.order == tuple(names) and description.head == "model/out/MatMul"


def test_a_tflite_model_is_found_by_its_identifier_under_any_name(models: dict[str, Path], tmp_path: Path) -> None:
    renamed = tmp_path / "weights.data"
    renamed.write_bytes(models["int8"].read_bytes())
    assert format_of(renamed).name == "tflite"
    assert set(_matrices(renamed)) == set(_matrices(models["int8"]))


def _independent_dequantise(q: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int) -> np.ndarray:
    """real = scale·(q − zero point), element by element, channel looked up by hand (float64)."""
    out = np.empty(q.shape, dtype=np.float64)
    for index in np.ndindex(q.shape):
        c = index[axis] if scale.size > 1 else 0
        out[index] = float(scale[c]) * (int(q[index]) - int(zero[c]))
    return out


@pytest.mark.parametrize("variant", ["int8", "uint8", "int16", "float16", "int8-external"])
def test_dequantisation_agrees_with_an_independent_implementation(models: dict[str, Path], variant: str) -> None:
    raw = models[variant].read_bytes()
    model = tflite.Model.GetRootAs(raw, 0)
    sg = model.Subgraphs(0)
    got = _matrices(models[variant])
    for key, name in zip(WEIGHTS, [f"tfl.pseudo_qconst{i}" for i in range(4)]):
        tensor = next(sg.Tensors(i) for i in range(sg.TensorsLength()) if sg.Tensors(i).Name().decode() == name)
        buffer = model.Buffers(tensor.Buffer())
        data = (np.frombuffer(raw, np.uint8, count=buffer.Size(), offset=buffer.Offset())
                if buffer.Offset() > 1 else buffer.DataAsNumpy())
        stored = data.view(_stored_dtype(tensor.Type())).reshape(tuple(tensor.ShapeAsNumpy()))
        if variant == "float16":
            expected = stored.astype(np.float64)
        else:
            q = tensor.Quantization()
            expected = _independent_dequantise(stored, q.ScaleAsNumpy(), q.ZeroPointAsNumpy(), q.QuantizedDimension())
        ours = got[name].numpy().astype(np.float64).transpose(np.argsort(TO_TORCH[key]))  # back to TFLite's layout
        # float32 arithmetic (as TFLite's DEQUANTIZE) against float64: one float32 rounding apart
        np.testing.assert_allclose(ours, expected, rtol=2 ** -23, atol=0)
        if variant != "float16":
            assert len(set(tensor.Quantization().ScaleAsNumpy())) == (1 if variant == "uint8" else weights_channels(key))


def weights_channels(key: str) -> int:
    return {"conv": 4, "depthwise": 4, "fc1": 32, "fc2": 10}[key]


def test_the_quantised_entries_say_how_they_were_stored(models: dict[str, Path]) -> None:
    for variant, quant in (("int8", "tflite-int8-per-channel"), ("uint8", "tflite-uint8-per-tensor"),
                           ("int16", "tflite-int16-per-channel"), ("float16", "tflite-float16")):
        with open_source(models[variant]) as source:
            read = [e for e in source.entries() if e.skip is None]
        assert [e.quant for e in read] == [quant] * 4 and {e.dtype for e in read} == {"float32"}
        assert [e.shape for e in read] == [(4, 3, 3, 3), (4, 1, 3, 3), (32, 64), (10, 32)]


def test_weights_after_the_flatbuffer_read_as_the_inline_ones(models: dict[str, Path]) -> None:
    inline, external = _matrices(models["int8"]), _matrices(models["int8-external"])
    assert list(inline) == list(external)
    assert all(torch.equal(inline[k], external[k]) for k in inline)


# ---- float and int8 twins -------------------------------------------------------------------------


def _bfe(w: np.ndarray) -> float:
    """F* (docs/math.md §2) from the singular values, independently of wbfe."""
    e = np.linalg.svd(w.astype(np.float64), compute_uv=False) ** 2
    return 0.5 * math.log(2 * math.pi * math.e) + 0.5 * (math.log(e.mean()) - float(np.mean(np.log(e))))


def _noise_bound(w: np.ndarray, error_fro: float) -> float:
    """The most F* can move when W changes by Δ with ‖Δ‖_F ≤ ``error_fro``: each singular value moves
    by at most ‖Δ‖₂ ≤ ‖Δ‖_F (Weyl), ‖W‖_F by at most ‖Δ‖_F, so
    |ΔF*| ≤ ½·[2·max|log(1 ± d/‖W‖_F)| + (2/p)·Σ −log(1 − d/σᵢ)]."""
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    assert error_fro < s.min(), "quantisation error larger than the smallest singular value: no bound"
    fro = float(np.linalg.norm(w))
    mean_e = 2 * max(math.log1p(error_fro / fro), -math.log1p(-error_fro / fro))
    mean_log = 2 * float(np.mean(-np.log1p(-error_fro / s)))
    return 0.5 * (mean_e + mean_log)


def test_a_float_model_and_its_int8_twin_agree_within_quantisation_noise(models: dict[str, Path],
                                                                         weights: dict[str, np.ndarray]) -> None:
    float_rows = wbfe.score(models["float32"], metrics="bfe").layers
    int8_rows = wbfe.score(models["int8"], metrics="bfe").layers
    assert len(float_rows) == len(int8_rows) == 4
    for key, a, b in zip(WEIGHTS, float_rows, int8_rows):
        w = weights[key].transpose(TO_TORCH[key]).reshape(weights[key].shape[TO_TORCH[key][0]], -1)
        assert a["bfe"] == pytest.approx(_bfe(w), rel=1e-9)  # wbfe's F* of the float weights
        # int8 symmetric per channel: each entry off by at most half its channel's step s_c = max|w_c|/127
        step = np.abs(w).max(axis=1) / 127
        error_fro = 0.5 * math.sqrt(float(np.sum(step ** 2 * w.shape[1])))
        bound = _noise_bound(w, error_fro)
        assert a["bfe"] != b["bfe"] and abs(a["bfe"] - b["bfe"]) <= bound, key
        # the bound is tight enough to catch a reader that applied one channel's scale to all of them
        q, scale = tw.quantize_symmetric(weights[key], tw.AXES[key], 8)
        one_scale = q.transpose(TO_TORCH[key]).reshape(w.shape).astype(np.float64) * float(scale[0])
        assert abs(_bfe(one_scale) - a["bfe"]) > bound, key


@pytest.mark.parametrize("variant", ["uint8", "int16", "float16"])
def test_every_variant_gives_the_same_matrices(models: dict[str, Path], variant: str) -> None:
    reference = _matrices(models["float32"])
    got = _matrices(models[variant])
    assert [t.shape for t in got.values()] == [t.shape for t in reference.values()]
    for (name, ours), expected in zip(got.items(), reference.values()):
        # uint8 per tensor: a step of (max − min)/255 over the whole tensor; int16: max|w_c|/32767
        w = expected.numpy()
        step = {"uint8": (max(w.max(), 0) - min(w.min(), 0)) / 255,
                "int16": np.abs(w.reshape(w.shape[0], -1)).max(axis=1).reshape((-1,) + (1,) * (w.ndim - 1)) / 32767,
                "float16": np.abs(w) * 2.0 ** -10}[variant]  # float16: a step (ulp) of at most |w|·2⁻¹⁰
        # plus the float32 rounding of the dequantised value (one unit in its last place)
        assert np.all(np.abs(ours.numpy() - w) <= step / 2 + np.spacing(np.abs(w))), name


# ---- hostile files ----------------------------------------------------------------------------------


def _graph(weights: dict[str, np.ndarray], variant: str = "int8") -> tw.Graph:
    return tw.twin_graph(weights, variant)


def _broken(weights: dict[str, np.ndarray], how: str) -> tuple[tw.Graph, bool]:
    g = _graph(weights)
    fc1 = next(t for t in g.tensors if t.name == "tfl.pseudo_qconst2")
    external = False
    if how == "shape":
        fc1.shape = (32, 65)  # 32·65 elements, 32·64 bytes
    elif how == "dtype":
        fc1.type = 99
    elif how == "scales":
        fc1.scale = list(fc1.scale)[:5]
        fc1.zero_point = [0] * 5
    elif how == "zero points":
        fc1.zero_point = list(fc1.zero_point)[:-1]
    elif how == "zero point range":
        fc1.zero_point = [200] * len(fc1.scale)
    elif how == "axis":
        fc1.axis = 7
    elif how == "buffer index":
        fc1.buffer = 1000
    elif how == "op input":
        g.ops[3].inputs = [g.ops[3].inputs[0], 500, g.ops[3].inputs[2]]
    elif how == "external past the end":
        external = True
    return g, external


@pytest.mark.parametrize("how, message", [
    ("shape", r"tensor 'tfl.pseudo_qconst2': shape \[32, 65\] of int8 needs 2080 bytes, its buffer \d+ holds 2048"),
    ("dtype", r"tensor 'tfl.pseudo_qconst2' .*unknown tensor type 99"),
    ("scales", r"tensor 'tfl.pseudo_qconst2' .*5 quantisation scales along dimension 0 of shape \[32, 64\]"),
    ("zero points", r"tensor 'tfl.pseudo_qconst2' .*32 quantisation scales but 31 zero points"),
    ("zero point range", r"tensor 'tfl.pseudo_qconst2' .*a zero point outside the range of int8 \[-128, 127\]"),
    ("axis", r"tensor 'tfl.pseudo_qconst2' .*32 quantisation scales along dimension 7"),
    ("buffer index", r"tensor 'tfl.pseudo_qconst2' .*buffer index 1000 out of range"),
    ("op input", r"operator 3: tensor index 500 out of range"),
    ("external past the end", r"buffer \d+: data at bytes \d+\.\.\d+ lies past the end"),
])
def test_an_inconsistent_file_is_refused_naming_what_is_wrong(tmp_path: Path, weights: dict[str, np.ndarray],
                                                              how: str, message: str) -> None:
    g, external = _broken(weights, how)
    path = tw.write(tmp_path / "bad.tflite", g, external=external)
    if external:  # the trailing area cut short: the last buffer's bytes are gone
        path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CorruptCheckpointError, match=message):
        _matrices(path)


def test_an_infinite_nan_or_zero_scale_skips_that_weight_alone_as_in_onnx(tmp_path: Path,
                                                                          weights: dict[str, np.ndarray]) -> None:
    """A NaN, infinite or zero quantisation scale gives the weight DEQUANTIZE computes: non-finite or all zero, that
    weight skipped saying so and the rest scored, as ONNX's DequantizeLinear does (tests/test_onnx.py). A NaN scale
    refused the whole file."""
    g = _graph(weights)
    tensors = {t.name: t for t in g.tensors}
    conv, depthwise, fc1 = (tensors[f"tfl.pseudo_qconst{i}"] for i in range(3))
    fc1.scale = [math.nan] + list(fc1.scale)[1:]  # one channel's
    conv.scale = [math.inf] * len(conv.scale)
    depthwise.scale = [0.0] * len(depthwise.scale)
    path = tw.write(tmp_path / "scales.tflite", g)
    result = wbfe.score(path, metrics="bfe")
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    assert [reasons[f"tfl.pseudo_qconst{i}"] for i in range(3)] == [NON_FINITE, ALL_ZERO, NON_FINITE]
    whole = wbfe.score(tw.write(tmp_path / "whole.tflite", _graph(weights)), metrics="bfe")
    assert [(r["name"], r["bfe"]) for r in result.layers] == [
        (r["name"], r["bfe"]) for r in whole.layers if r["name"] == "tfl.pseudo_qconst3"]


def test_not_a_tflite_file_is_refused(tmp_path: Path, models: dict[str, Path]) -> None:
    raw = bytearray(models["float32"].read_bytes())
    raw[4:8] = b"TFL2"
    path = tmp_path / "m.tflite"
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match=r"not a TFLite model \(file identifier b'TFL2'"):
        _matrices(path)
    path.write_bytes(b"\x10\0\0")
    with pytest.raises(CorruptCheckpointError, match="too short"):
        _matrices(path)
    raw = bytearray(models["float32"].read_bytes())
    raw[0:4] = (0xFFFFFF00).to_bytes(4, "little")  # the root table's offset, far past the end
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match=r"the model header: flatbuffer offsets out of range"):
        _matrices(path)


def _read_everything(path: Path) -> Any:
    with open_source(path) as source:
        return [(e.name, to_torch(e.load()) if e.skip is None else e.skip) for e in source.entries()]


@pytest.mark.parametrize("variant", ["int8", "float16", "int8-external"])
def test_truncated_and_mutated_files_give_a_typed_error_or_their_weights(tmp_path: Path, models: dict[str, Path],
                                                                          variant: str) -> None:
    """Every prefix length class and 300 seeded byte mutations: each either reads (every weight
    loads) or is refused with a WbfeError; never an IndexError, struct.error or other crash."""
    raw = models[variant].read_bytes()
    path = tmp_path / "m.tflite"
    rng = np.random.default_rng(0)
    cases = [raw[:n] for n in sorted({8, 12, 16, 64, len(raw) // 3, len(raw) // 2, len(raw) - 16, len(raw) - 1})]
    for _ in range(300):
        mutated = bytearray(raw)
        for at in rng.integers(8, len(raw), size=int(rng.integers(1, 4))):
            mutated[int(at)] = int(rng.integers(0, 256))
        cases.append(bytes(mutated))
    refused = 0
    for case in cases:
        path.write_bytes(case)
        try:
            _read_everything(path)
        except WbfeError:
            refused += 1
    assert refused >= 8  # the truncations at least


# ---- compare: a float model against its int8 twin, paired by graph order ---------------------------

_KERAS = """
import sys, numpy as np, keras
keras.utils.set_random_seed(0)
m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv"),
                      keras.layers.DepthwiseConv2D(3, name="depthwise"), keras.layers.Flatten(),
                      keras.layers.Dense(32, name="hidden"), keras.layers.Dense(10, activation="softmax", name="out")])
out = sys.argv[1]
m.save(out + "/float.h5")
np.savez(out + "/weights.npz", *m.get_weights())
"""


@pytest.fixture(scope="module")
def keras_twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """A Keras 3 model saved by Keras itself as .h5, and its int8 TFLite conversion, written as
    TFLite's converter lays the same weights out."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("keras") is None:
        pytest.skip("the Keras twin needs keras (in the test extra)")
    folder = tmp_path_factory.mktemp("keras_twin")
    env = dict(os.environ, KERAS_BACKEND="torch")  # its own process: the backend is chosen at import
    subprocess.run([sys.executable, "-c", _KERAS, str(folder)], env=env, check=True, capture_output=True, timeout=300)
    k = np.load(folder / "weights.npz")
    w = {"conv": k["arr_0"].transpose(3, 0, 1, 2),  # kh kw in out -> out kh kw in
         "conv_bias": k["arr_1"],
         "depthwise": k["arr_2"].transpose(3, 0, 1, 2),  # kh kw C 1 -> 1 kh kw C
         "depthwise_bias": k["arr_3"], "fc1": k["arr_4"].T, "fc1_bias": k["arr_5"], "fc2": k["arr_6"].T,
         "fc2_bias": k["arr_7"]}
    w = {key: np.ascontiguousarray(v, dtype=np.float32) for key, v in w.items()}
    tflite_path = tw.write(folder / "model_int8.tflite", tw.twin_graph(w, "int8"))
    return folder / "float.h5", tflite_path, w


def test_compare_pairs_a_keras_model_and_its_int8_twin_by_graph_order(keras_twin: Any) -> None:
    h5, int8, w = keras_twin
    result = wbfe.compare(h5, int8, metrics="bfe")
    assert result.summary["pairing"] == "graph order" and "pairing_note" not in result.summary
    assert [row["name_b"] for row in result.layers] == [f"tfl.pseudo_qconst{i}" for i in range(4)]
    assert [row["shape"] for row in result.layers] == [[4, 3, 3, 3], [4, 1, 3, 3], [32, 64], [10, 32]]
    assert not result.unmatched
    assert result.summary["head"] == result.layers[-1]["name"]  # the Keras graph's output layer
    assert sum(s["reason"] == "bias" for s in result.skipped if s.get("side") == "a") == 4
    for key, row in zip(WEIGHTS, result.layers):
        m = w[key].transpose(TO_TORCH[key]).reshape(w[key].shape[TO_TORCH[key][0]], -1)
        step = np.abs(m).max(axis=1) / 127  # each entry within half its channel's int8 step
        error_fro = 0.5 * math.sqrt(float(np.sum(step ** 2 * m.shape[1])))
        assert 0 < row["rel_frobenius"] <= error_fro / np.linalg.norm(m) * (1 + 1e-6), key
        assert abs(row["d_bfe"]) <= _noise_bound(m, error_fro), key


def test_compare_by_name_when_the_names_agree_and_refuses_order_when_matrices_differ(
        models: dict[str, Path], tmp_path: Path, weights: dict[str, np.ndarray]) -> None:
    same = wbfe.compare(models["int8"], models["int16"], metrics="bfe")  # the converter's names on both sides
    assert same.summary["pairing"] == "name" and len(same.layers) == 4
    by_order = wbfe.compare(models["float32"], models["int8"], metrics="bfe")
    assert by_order.summary["pairing"] == "graph order"
    assert [r["name"] for r in by_order.layers] == list(_matrices(models["float32"]))
    assert by_order.summary["head"] == "model/out/MatMul"  # A's graph names its head
    # one FULLY_CONNECTED fewer on B: no one-to-one correspondence, so names decide (and none match)
    g = tw.twin_graph(weights, "int8")
    g.ops[4] = tw.Op(tw.SOFTMAX, [g.ops[4].inputs[0]], g.ops[4].outputs)
    fewer = tw.write(tmp_path / "fewer.tflite", g)
    with pytest.raises(wbfe.errors.NoUsableMatrixError, match=r"not paired by graph order: A has 4 matrices, B 3"):
        wbfe.compare(models["float32"], fewer, metrics="bfe")


# ---- what the graph says about other operators ----------------------------------------------------


def _const(g: tw.Graph, name: str, array: np.ndarray, type_: int = tw.FLOAT32, **quant: Any) -> int:
    return g.add(tw.Tensor(name, array.shape, type_, array.tobytes(), **quant))


def test_other_operators_and_what_is_skipped(tmp_path: Path) -> None:
    """BATCH_MATMUL (stored in × out unless adj_y), a GATHER table, a shuffled FULLY_CONNECTED, an
    int8 weight without scales, an int8 weight through DEQUANTIZE (dynamic range), a shared buffer."""
    rng = np.random.default_rng(3)
    bmm = rng.standard_normal((6, 5)).astype(np.float32)  # in × out
    bmm_t = rng.standard_normal((4, 5)).astype(np.float32)  # out × in (adj_y)
    table = rng.standard_normal((20, 6)).astype(np.float32)
    q = rng.integers(-127, 128, (3, 4)).astype(np.int8)
    g = tw.Graph()
    ids = g.add(tw.Tensor("ids", (1, 2), tw.INT32))
    emb = g.add(tw.Tensor("emb", (1, 2, 6)))
    g.ops.append(tw.Op(36, [_const(g, "table", table), ids], [emb]))  # GATHER(params, indices)
    h = g.add(tw.Tensor("h", (1, 2, 5)))
    g.ops.append(tw.Op(tw.BATCH_MATMUL, [emb, _const(g, "bmm", bmm)], [h], adj_y=False))
    h2 = g.add(tw.Tensor("h2", (1, 2, 4)))
    g.ops.append(tw.Op(tw.BATCH_MATMUL, [h, _const(g, "bmm_t", bmm_t)], [h2], adj_y=True))
    shared = g.add(tw.Tensor("shared", (6, 5), buffer=2))  # bmm's buffer (buffer 1 is the table's)
    g.ops.append(tw.Op(tw.FULLY_CONNECTED, [h, shared, -1], [g.add(tw.Tensor("h5", (1, 2, 6)))]))
    shuffled = _const(g, "shuffled", q, tw.INT8, scale=[0.5], zero_point=[0])
    h3 = g.add(tw.Tensor("h3", (1, 3)))
    g.ops.append(tw.Op(tw.FULLY_CONNECTED, [h2, shuffled, -1], [h3], weights_format=1))
    bare = _const(g, "no_scales", q, tw.INT8)
    h4 = g.add(tw.Tensor("h4", (1, 3)))
    g.ops.append(tw.Op(tw.FULLY_CONNECTED, [h2, bare, -1], [h4]))
    dyn = _const(g, "dynamic", q, tw.INT8, scale=[0.25, 0.5, 1.0], zero_point=[0, 1, -1], axis=0)
    deq = g.add(tw.Tensor("dynamic_dequantized", (3, 4)))
    g.ops.append(tw.Op(tw.DEQUANTIZE, [dyn], [deq]))
    out = g.add(tw.Tensor("out", (1, 3)))
    g.ops.append(tw.Op(tw.FULLY_CONNECTED, [h2, deq, -1], [out]))
    g.inputs, g.outputs = [ids], [out]
    path = tw.write(tmp_path / "ops.tflite", g)
    with open_source(path) as source:
        entries = {e.name: e for e in source.entries()}
        read = {name: to_torch(e.load()) for name, e in entries.items() if e.skip is None}
        head = source.description.head  # type: ignore[union-attr]
    assert list(read) == ["table", "bmm", "bmm_t", "shared", "dynamic"]  # the graph's order
    assert torch.equal(read["table"], torch.from_numpy(table))
    assert torch.equal(read["bmm"], torch.from_numpy(bmm.T.copy())) and entries["bmm"].shape == (5, 6)
    assert torch.equal(read["bmm_t"], torch.from_numpy(bmm_t))
    expected = (q.astype(np.float64) - np.array([[0], [1], [-1]])) * np.array([[0.25], [0.5], [1.0]])
    assert np.array_equal(read["dynamic"].numpy(), expected.astype(np.float32))
    assert entries["dynamic"].quant == "tflite-int8-per-channel" and head == "dynamic"
    assert entries["shuffled"].skip == "FULLY_CONNECTED weights in a shuffled format (SHUFFLED4x16INT8): not read"
    assert entries["no_scales"].skip == "int8 weight without quantisation scales: its real values are unknown"
    assert "ids" not in entries and "h" not in entries  # activations have no buffer: not stored tensors
    assert entries["shared"].storage_key == entries["bmm"].storage_key  # one buffer, two tensors
    scored = wbfe.score(path, metrics="bfe")
    assert any(s["name"] == "shared" and "tie" in s["reason"] for s in scored.skipped)


def test_score_takes_the_graphs_head_and_order(models: dict[str, Path]) -> None:
    result = wbfe.score(models["int8"], metrics="bfe")
    assert [row["name"] for row in result.layers] == [f"tfl.pseudo_qconst{i}" for i in range(4)]
    assert result.summary["head"] == "tfl.pseudo_qconst3" and result.summary["head_source"] == "framework"
    assert result.model["framework"]["used"] == "tflite"
    assert result.model["format"] == "tflite"


def test_a_graph_whose_output_no_fully_connected_produces_has_no_head(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    g = tw.Graph()
    x = g.add(tw.Tensor("x", (1, 8, 8, 3)))
    y = g.add(tw.Tensor("y", (1, 6, 6, 4)))
    g.ops = [tw.Op(tw.CONV_2D, [x, _const(g, "k", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)), -1], [y])]
    g.inputs, g.outputs = [x], [y]
    with open_source(tw.write(tmp_path / "conv.tflite", g)) as source:
        assert [e.shape for e in source.entries()] == [(4, 3, 3, 3)]
        description = source.description
    assert description is not None and description.head is None
    assert description.note == "no FULLY_CONNECTED with a readable weight produces the graph's output"
    g.outputs = []  # a subgraph that declares no output: nothing to trace a head back from
    with open_source(tw.write(tmp_path / "no-output.tflite", g)) as source:
        description = source.description
    assert description is not None and description.head is None
    assert description.note == "the main subgraph has no output"


def test_the_cli_says_the_matrices_were_paired_by_graph_order(models: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    table = runner.invoke(app, ["compare", str(models["float32"]), str(models["int8"]), "--metrics", "bfe"])
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[0].endswith("(paired by graph order: the names differ)")
    assert re.search(r"^pairing\s+graph order$", table.stdout, flags=re.M)
    same = runner.invoke(app, ["compare", str(models["int8"]), str(models["int16"]), "--metrics", "bfe",
                               "--format", "json"])
    assert same.exit_code == 0 and '"pairing": "name"' in same.stdout


def test_graph_plans_of_several_subgraphs_keep_names_apart() -> None:
    """Plain records (no file): tensor names repeat across subgraphs (a WHILE body and the main
    graph) and within one; each listed name is unique, the main graph's first."""
    from wbfe.sources.tflite_graph import TflBuffer, TflModel, TflOp, TflSubgraph, TflTensor, plan_graph

    def subgraph(name: str, buffer: int) -> TflSubgraph:
        tensors = (TflTensor(0, "x", (1, 4), "float32", 0), TflTensor(1, "w", (3, 4), "float32", buffer),
                   TflTensor(2, "w", (3, 4), "float32", buffer + 1), TflTensor(3, "y", (1, 3), "float32", 0),
                   TflTensor(4, "z", (1, 3), "float32", 0))
        ops = (TflOp(0, "FULLY_CONNECTED", (0, 1, -1), (3,)), TflOp(1, "FULLY_CONNECTED", (0, 2, -1), (4,)))
        return TflSubgraph(name, tensors, ops, (4,))

    buffers = (TflBuffer(0, 0),) + tuple(TflBuffer(100 * i, 48) for i in range(1, 5))
    plan = plan_graph(TflModel(3, "", (subgraph("main", 1), subgraph("body", 3)), buffers))
    assert [p.name for p in plan.tensors] == ["w", "w#2", "body/w", "body/w#2"]
    assert plan.head == "w#2"  # the FULLY_CONNECTED producing the main graph's output


@pytest.mark.parametrize("variant", ["int8", "int8-external"])
def test_each_weight_is_one_read_of_exactly_its_buffer(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                       variant: str) -> None:
    import wbfe.sources.tflite_files as reader

    reads: list[tuple[int, int]] = []
    real_read = reader.read_range

    def recording(path: Path, first: int, nbytes: int) -> np.ndarray:
        reads.append((first, nbytes))
        return real_read(path, first, nbytes)

    monkeypatch.setattr(reader, "read_range", recording)
    _matrices(models[variant])
    raw = models[variant].read_bytes()
    model = tflite.Model.GetRootAs(raw, 0)
    sg = model.Subgraphs(0)
    expected = []
    for i in range(4):  # the weights' buffers, where the tflite accessors find them
        tensor = next(sg.Tensors(k) for k in range(sg.TensorsLength())
                      if sg.Tensors(k).Name().decode() == f"tfl.pseudo_qconst{i}")
        buffer = model.Buffers(tensor.Buffer())
        if buffer.Offset() > 1:
            expected.append((buffer.Offset(), buffer.Size()))
        else:  # the data vector's first byte (flatbuffers' Table.Vector) and its length
            expected.append((buffer._tab.Vector(buffer._tab.Offset(4)), buffer.DataLength()))
        assert expected[-1][1] == int(np.prod(tensor.ShapeAsNumpy()))  # int8: one byte per element
    assert reads == expected


def test_the_cli_refuses_a_broken_file_with_one_line_and_exit_2(tmp_path: Path,
                                                                weights: dict[str, np.ndarray]) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    g, _ = _broken(weights, "shape")
    path = tw.write(tmp_path / "bad.tflite", g)
    done = CliRunner().invoke(app, ["score", str(path), "--metrics", "bfe"])
    assert done.exit_code == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "tensor 'tfl.pseudo_qconst2': shape [32, 65]" in lines[0]
    assert "Traceback" not in done.output


def test_a_module_order_is_no_graph_order_to_pair_by(models: dict[str, Path]) -> None:
    """A torch module lists its parameters in registration order, not the order it computes in:
    even with the same matrices (count and shapes), it is not paired with a graph by position."""
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3, groups=4), torch.nn.Flatten(),
                                 torch.nn.Linear(64, 32), torch.nn.Linear(32, 10))
    with pytest.raises(wbfe.errors.NoUsableMatrixError) as refused:
        wbfe.compare(module, models["int8"], metrics="bfe")
    assert "graph order" not in str(refused.value)


def test_a_sparse_weight_is_skipped_not_refused(tmp_path: Path) -> None:
    """A sparse model (MediaPipe's ``*_sparse.tflite``): the constant holds only the kept values,
    fewer bytes than its dense shape, and reaches its CONV_2D through DENSIFY and DEQUANTIZE."""
    g = tw.Graph()
    x = g.add(tw.Tensor("x", (1, 8, 8, 3)))
    kept = np.arange(10, dtype="<f2").tobytes()
    sparse = g.add(tw.Tensor("k_sparse", (4, 3, 3, 3), tw.FLOAT16, kept, sparse=True))
    dense = g.add(tw.Tensor("k_dense", (4, 3, 3, 3), tw.FLOAT16))
    k = g.add(tw.Tensor("k", (4, 3, 3, 3)))
    y = g.add(tw.Tensor("y", (1, 6, 6, 4)))
    g.ops = [tw.Op(tw.DENSIFY, [sparse], [dense]), tw.Op(tw.DEQUANTIZE, [dense], [k]), tw.Op(tw.CONV_2D, [x, k, -1], [y])]
    g.inputs, g.outputs = [x], [y]
    path = tw.write(tmp_path / "sparse.tflite", g)
    with open_source(path) as source:
        (entry,) = list(source.entries())
        # An edit reads it to copy it: its kept values in the dense shape raised a bare ValueError
        with pytest.raises(wbfe.errors.UnsupportedDtypeError, match=r"sparse\.tflite: tensor 'k_sparse': sparse"):
            entry.load()
    assert entry.name == "k_sparse"
    assert entry.skip == "sparse tensor (TFLite sparsity parameters): wbfe reads dense weights only"


def test_bfe_applicability_is_unknown_for_an_inference_graph(models: dict[str, Path]) -> None:
    """The converter removes dropout, so the graph cannot show whether the paper's condition holds."""
    summary = wbfe.score(models["float32"], metrics="bfe").summary
    verdict = summary["bfe_applicability"]
    assert summary["head_source"] == "framework" and verdict["status"] == "unknown"
    assert "converter removes dropout" in verdict["reasons"][0] and summary["head"] in verdict["reasons"][0]


@pytest.mark.parametrize("own_buffer", [True, False])
def test_an_empty_weight_is_listed_as_skipped(tmp_path: Path, own_buffer: bool) -> None:
    """A 0-row FULLY_CONNECTED weight has an empty buffer, as an activation has (its own, or the sentinel
    buffer 0): the graph tells it apart (no operator nor graph input feeds it), so it is listed as skipped,
    while an empty constant that is no weight (a RESHAPE's shape) and the activations stay out."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((20, 30)).astype(np.float32)
    g = tw.Graph()
    x = g.add(tw.Tensor("x", (1, 30)))
    out = g.add(tw.Tensor("out", (1, 20)))
    g.ops.append(tw.Op(tw.FULLY_CONNECTED, [x, _const(g, "w", w), -1], [out]))
    empty_w = g.add(tw.Tensor("empty_w", (0, 30), tw.FLOAT32, b"" if own_buffer else None))
    nothing = g.add(tw.Tensor("nothing", (1, 0)))
    g.ops.append(tw.Op(tw.FULLY_CONNECTED, [x, empty_w, -1], [nothing]))
    scalar_shape = g.add(tw.Tensor("scalar_shape", (0,), tw.INT32, b""))
    g.ops.append(tw.Op(tw.RESHAPE, [nothing, scalar_shape], [g.add(tw.Tensor("flat", (0,)))]))
    g.inputs, g.outputs = [x], [out]
    path = tw.write(tmp_path / "empty.tflite", g)
    result = wbfe.score(path, metrics="bfe")
    assert [r["name"] for r in result.layers] == ["w"]
    from wbfe.metrics.bfe import bfe

    eigs = np.linalg.svd(w.astype(np.float64), compute_uv=False) ** 2
    assert result.layers[0]["bfe"] == pytest.approx(bfe(eigs)[0], rel=1e-9)
    assert [(s["name"], s["reason"], s["shape"]) for s in result.skipped] == [
        ("empty_w", "empty weight tensor (0 elements)", [0, 30])]


def test_one_buffer_read_with_other_scales_or_shape_is_another_weight_not_a_tie(tmp_path: Path) -> None:
    """Tensors sharing a buffer were keyed by the buffer alone: an int8 weight read with other scales, or as another
    shape, was skipped as 'tied' to the first and never scored. Each is scored as the dequantised matrix it is."""
    rng = np.random.default_rng(9)
    q = rng.integers(-127, 128, (6, 5)).astype(np.int8)
    scales = [0.01, 0.02, 0.05, 0.1, 0.5, 1.0]
    g = tw.Graph()
    x, h, h2, h3 = (g.add(tw.Tensor(n, s)) for n, s in (("x", (1, 5)), ("h", (1, 6)), ("h2", (1, 6)), ("h3", (1, 5))))
    a = _const(g, "fc_a", q, tw.INT8, scale=[0.01], zero_point=[0])
    b = g.add(tw.Tensor("fc_b", (6, 5), tw.INT8, scale=scales, zero_point=[0] * 6, axis=0, buffer=1))  # fc_a's
    c = g.add(tw.Tensor("fc_c", (5, 6), tw.INT8, scale=[0.01], zero_point=[0], buffer=1))
    again = g.add(tw.Tensor("fc_a_again", (6, 5), tw.INT8, scale=[0.01], zero_point=[0], buffer=1))
    g.ops = [tw.Op(tw.FULLY_CONNECTED, [x, a, -1], [h]), tw.Op(tw.FULLY_CONNECTED, [x, b, -1], [h2]),
             tw.Op(tw.FULLY_CONNECTED, [x, again, -1], [g.add(tw.Tensor("h4", (1, 6)))]),
             tw.Op(tw.FULLY_CONNECTED, [h2, c, -1], [h3])]
    g.inputs, g.outputs = [x], [h3]
    result = wbfe.score(tw.write(tmp_path / "shared.tflite", g), metrics="bfe")
    f = q.astype(np.float32)  # real = scale·q in float32, as TFLite computes it
    want = {"fc_a": f * np.float32(0.01), "fc_b": f * np.array(scales, np.float32)[:, None],
            "fc_c": f.reshape(5, 6) * np.float32(0.01)}
    reference = wbfe.score({k: torch.from_numpy(v) for k, v in want.items()}, metrics="bfe")
    assert [(r["name"], r["bfe"]) for r in result.layers] == [(r["name"], r["bfe"]) for r in reference.layers]
    assert [(s["name"], s["reason"]) for s in result.skipped] == [("fc_a_again", "tied: shares storage with fc_a")]


def _int4_model(tmp_path: Path, q: np.ndarray, nbytes: int, zero: list[int], scale: list[float]) -> Path:
    """A FULLY_CONNECTED whose [out, in] weight is INT4 (TensorType 17), packed two values a byte as TFLite's
    tensor_utils::UnpackDenseInt4IntoInt8 unpacks them: element 2i in the low nibble of byte i, 2i+1 in the high
    one, sign-extended; an odd count leaves the last high nibble unused."""
    flat = (q.ravel() & 0xF).astype(np.uint8)
    packed = np.zeros(nbytes, np.uint8)
    n = min(flat.size, 2 * nbytes)
    packed[:(n + 1) // 2] |= flat[:n:2]
    packed[:n // 2] |= flat[1:n:2] << 4
    g = tw.Graph()
    x, y = g.add(tw.Tensor("x", (1, q.shape[1]))), g.add(tw.Tensor("y", (1, q.shape[0])))
    w = g.add(tw.Tensor("w", q.shape, 17, packed.tobytes(), scale=scale, zero_point=zero, axis=0))
    g.ops.append(tw.Op(tw.FULLY_CONNECTED, [x, w, -1], [y], weights_format=0))
    g.inputs, g.outputs = [x], [y]
    return tw.write(tmp_path / "int4.tflite", g)


def test_an_int4_weight_is_unpacked_and_dequantised_as_tflite_does(tmp_path: Path) -> None:
    """int4 weights (TFLite's INT4, written by weight-only int4 quantisers) were skipped as a type wbfe does not
    read; they are unpacked as TFLite unpacks them and dequantised per channel, zero points included: checked
    against scale · (q − zero point) of the values packed. A buffer of the wrong size is refused."""
    rng = np.random.default_rng(4)
    q = rng.integers(-8, 8, size=(5, 7)).astype(np.int8)  # 35 values: an odd count, 18 bytes
    zero, scale = [1, -2, 0, 3, -8], rng.uniform(0.01, 0.1, 5).astype(np.float32).tolist()
    with open_source(_int4_model(tmp_path, q, 18, zero, scale)) as source:
        entry = next(iter(source.entries()))
        assert entry.skip is None and entry.quant == "tflite-int4-per-channel" and entry.shape == (5, 7)
        want = (q.astype(np.float32) - np.array(zero, np.float32)[:, None]) * np.array(scale, np.float32)[:, None]
        assert np.array_equal(to_torch(entry.load()).numpy(), want)
    with pytest.raises(CorruptCheckpointError, match=r"tensor 'w': shape \[5, 7\] of int4 needs 18 bytes, its buffer "
                       r"\d+ holds 35"):
        open_source(_int4_model(tmp_path, q, 35, zero, scale))


# TensorType codes of schema.fbs that numpy holds, each with numpy's little-endian dtype (written out here, not
# taken from the reader).
OTHER_TYPES = {2: "<i4", 4: "<i8", 6: "?", 8: "<c8", 10: "<f8", 11: "<c16", 12: "<u8", 15: "<u4", 16: "<u2"}


def test_a_constant_of_any_type_reads_as_its_values_or_is_refused_naming_it(tmp_path: Path,
                                                                              models: dict[str, Path]) -> None:
    """A constant that is no weight (a RESHAPE's int32 shape) is still read when an edit copies it: one of a type
    missing from the reader's table raised a bare KeyError (``wbfe smooth`` of any real model crashed). Each type
    numpy holds reads as the values written; a string constant, which numpy cannot hold, is listed as skipped and
    refused with one line naming it and its type."""
    rng = np.random.default_rng(6)
    g = tw.Graph()
    x = g.add(tw.Tensor("x", (1, 6)))
    written = {}
    for code, dtype in OTHER_TYPES.items():
        drawn = rng.uniform(0, 60000, (2, 3))
        values = (drawn > 30000 if dtype == "?" else drawn + 1j * drawn[::-1] if "c" in dtype else drawn).astype(dtype)
        written[f"c{code}"] = values
        g.ops.append(tw.Op(tw.RESHAPE, [x, _const(g, f"c{code}", values, code)], [g.add(tw.Tensor(f"y{code}", (2, 3)))]))
    text = np.array([1, 12, 15], "<i4").tobytes() + b"abc"  # TFLite's string buffer: count, offsets, bytes
    g.ops.append(tw.Op(tw.RESHAPE, [x, g.add(tw.Tensor("words", (1,), 5, text))], [g.add(tw.Tensor("y", (1,)))]))
    g.inputs, g.outputs = [x], [g.add(tw.Tensor("out", (1,)))]
    with open_source(tw.write(tmp_path / "types.tflite", g)) as source:
        entries = {e.name: e for e in source.entries()}
        assert list(entries) == [*written, "words"] and all(e.skip for e in entries.values())
        for name, values in written.items():
            read = entries[name].load()
            assert read.dtype == values.dtype and np.array_equal(read, values), name
        with pytest.raises(wbfe.errors.UnsupportedDtypeError) as refused:
            entries["words"].load()
    assert re.fullmatch(r".*types\.tflite: tensor 'words': TFLite type string has no numpy dtype.*", str(refused.value))
    # End to end: an edit copies the RESHAPE's shape [1, 64] as it is and writes the file.
    from safetensors.numpy import load_file

    from wbfe.editing import smooth_checkpoint

    smooth_checkpoint(models["float32"], tmp_path / "smoothed.safetensors")
    shape = load_file(tmp_path / "smoothed.safetensors")["model/flatten/Const"]
    assert shape.dtype == np.int32 and shape.tolist() == [1, 64]
