"""A CPU score of float weights in safetensors, GGUF, Keras, ONNX or NumPy files imports no torch
(issue 35 §2), and gives the numbers that the same weights give as a torch state dict.

Each score runs in a fresh interpreter (``wbfe score ... --device cpu``) whose ``sys.modules`` is
read when it exits; the reference is scored in this process from torch tensors, the kind every
reader handed over before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import wbfe
from tests.test_gguf import write_gguf
from tests.test_keras import keras2_names, torch_model, write_keras2_h5

PROBE = """
import json, sys
sys.argv = ["wbfe", *json.loads(sys.argv[1])]
from wbfe_cli.main import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
sys.stderr.write("LOADED " + json.dumps({"torch": "torch" in sys.modules, "code": code}) + "\\n")
"""
METRICS = "bfe,htsr,htmp"
COLUMNS = ("bfe", "bfe_dual", "alpha", "log_norm", "stable_rank", "lambda_max", "entropy", "kappa")


def score_in_fresh_process(path: Path, out: Path, *extra: str) -> tuple[bool, dict]:
    argv = ["score", str(path), "--device", "cpu", "--metrics", METRICS, "--format", "json", "-o", str(out), *extra]
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                          timeout=300)
    line = next((x for x in done.stderr.splitlines() if x.startswith("LOADED ")), None)
    assert line is not None, done.stderr[-2000:]
    loaded = json.loads(line[len("LOADED "):])
    assert loaded["code"] in (0, None), done.stderr[-2000:]
    return loaded["torch"], json.loads(out.read_text())


def assert_same_rows(got: dict, want: wbfe.ModelScore, names: dict[str, str] | None = None) -> None:
    rows = {(names or {}).get(r["name"], r["name"]): r for r in got["layers"]}
    reference = {r["name"]: r for r in want.layers}
    assert rows and set(rows) == set(reference)
    for name, row in rows.items():
        for column in COLUMNS:
            a, b = row.get(column), reference[name].get(column)
            if b is None or b != b:  # the JSON output writes NaN as null
                assert a is None or a != a, (name, column)
            else:
                # Same arithmetic on the same float64 copies; only BLAS's summation order may differ.
                assert a == pytest.approx(b, rel=1e-9, abs=1e-12), (name, column)


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"fc1.weight": torch.randn(96, 160, generator=g) / 8, "fc1.bias": torch.randn(96, generator=g),
            "fc2.weight": torch.randn(128, 96, generator=g) / 8, "square.weight": torch.randn(300, 300, generator=g),
            "head.weight": torch.randn(40, 128, generator=g) / 8}


def test_the_shipped_fixture(tmp_path: Path) -> None:
    """The README's first command: the safetensors fixture, with the default metrics too."""
    from safetensors.torch import load_file

    from wbfe.fixtures import default_checkpoint

    checkpoint = default_checkpoint()
    loaded, got = score_in_fresh_process(checkpoint, tmp_path / "out.json")
    assert loaded is False
    assert_same_rows(got, wbfe.score(load_file(str(checkpoint)), metrics=METRICS, device="cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_safetensors(tmp_path: Path, state: dict, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    typed = {k: v.to(dtype) for k, v in state.items()}
    save_file(typed, str(tmp_path / "model.safetensors"))
    loaded, got = score_in_fresh_process(tmp_path / "model.safetensors", tmp_path / "out.json")
    assert loaded is False
    assert_same_rows(got, wbfe.score(typed, metrics=METRICS, device="cpu"))


def test_bfloat16_is_where_torch_comes_in(tmp_path: Path, state: dict) -> None:
    """numpy has no bfloat16: such a tensor is torch's to hold, and the numbers are the same."""
    from safetensors.torch import save_file

    typed = {k: v.to(torch.bfloat16) for k, v in state.items()}
    save_file(typed, str(tmp_path / "model.safetensors"))
    loaded, got = score_in_fresh_process(tmp_path / "model.safetensors", tmp_path / "out.json")
    assert loaded is True
    assert_same_rows(got, wbfe.score(typed, metrics=METRICS, device="cpu"))


def test_numpy_npz(tmp_path: Path, state: dict) -> None:
    np.savez(tmp_path / "weights.npz", **{k: v.numpy() for k, v in state.items()})
    loaded, got = score_in_fresh_process(tmp_path / "weights.npz", tmp_path / "out.json")
    assert loaded is False
    assert_same_rows(got, wbfe.score(state, metrics=METRICS, device="cpu"))


@pytest.mark.parametrize("kind", ["F32", "F16"])
def test_gguf(tmp_path: Path, state: dict, kind: str) -> None:
    pytest.importorskip("gguf")
    path = write_gguf(tmp_path / "model.gguf", state, kind)
    loaded, got = score_in_fresh_process(path, tmp_path / "out.json")
    assert loaded is False
    reference = state if kind == "F32" else {k: v.half() if v.ndim == 2 else v for k, v in state.items()}
    assert_same_rows(got, wbfe.score(reference, metrics=METRICS, device="cpu"))


def test_keras_h5(tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    original = torch_model()
    path = write_keras2_h5(tmp_path / "model.h5", original)
    loaded, got = score_in_fresh_process(path, tmp_path / "out.json")
    assert loaded is False
    assert_same_rows(got, wbfe.score(original, metrics=METRICS, device="cpu"), keras2_names())


def test_onnx(tmp_path: Path, state: dict) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    # Gemm with transB=1 takes (out, in) weights, as torch.onnx.export writes a Linear.
    nodes, inits, x = [], [], "x"
    for i, name in enumerate(("fc1", "fc2", "head")):
        nodes.append(helper.make_node("Gemm", [x, f"{name}.weight"], [f"h{i}"], transB=1))
        inits.append(numpy_helper.from_array(state[f"{name}.weight"].numpy(), f"{name}.weight"))
        x = f"h{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 160])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 40])], inits)
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    loaded, got = score_in_fresh_process(tmp_path / "model.onnx", tmp_path / "out.json")
    assert loaded is False
    layers = {k: state[k] for k in ("fc1.weight", "fc2.weight", "head.weight")}
    assert_same_rows(got, wbfe.score(layers, metrics=METRICS, device="cpu"))


def test_a_pickle_still_loads_torch(tmp_path: Path, state: dict) -> None:
    """The probe is not blind: a PyTorch pickle needs torch, and says so in sys.modules."""
    torch.save(state, tmp_path / "model.pt")
    loaded, got = score_in_fresh_process(tmp_path / "model.pt", tmp_path / "out.json")
    assert loaded is True
    assert_same_rows(got, wbfe.score(state, metrics=METRICS, device="cpu"))


def test_flax_msgpack(tmp_path: Path) -> None:
    pytest.importorskip("msgpack")
    from tests.test_flax_files import CONV, CONV1D, DENSE, EMBED, HEAD, tree, write

    write(tmp_path / "flax_model.msgpack", tree())
    loaded, got = score_in_fresh_process(tmp_path / "flax_model.msgpack", tmp_path / "out.json")
    assert loaded is False
    # The same weights in PyTorch's layout (Flax keeps a kernel as in × out).
    as_torch = {"embed.weight": EMBED, "conv.weight": CONV.transpose(3, 2, 0, 1), "conv1d.weight": CONV1D.transpose(2, 1, 0),
                "layer.0.dense.weight": DENSE.T, "classifier.weight": HEAD.T}
    assert_same_rows(got, wbfe.score({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in as_torch.items()},
                                     metrics=METRICS, device="cpu"))


def test_a_score_without_torch_records_the_same_torch_version() -> None:
    """Provenance names torch's version whether or not the score imported it (the package metadata
    lacks the build tag, ``+cpu``/``+cu130``, that torch.__version__ carries)."""
    code = ("import json, sys; from wbfe._provenance import installed_versions; "
            "print(json.dumps([installed_versions()['torch'], 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    version, loaded = json.loads(out.stdout)
    assert loaded is False and version == torch.__version__


def test_tflite(tmp_path: Path) -> None:
    """An int8 TFLite model is dequantised with numpy alone; the same numbers as in this process."""
    pytest.importorskip("tflite")
    from tests import tflite_writer as tw

    path = tw.write(tmp_path / "model.tflite", tw.twin_graph(tw.random_weights(seed=0), "int8"))
    loaded, got = score_in_fresh_process(path, tmp_path / "out.json")
    assert loaded is False
    assert_same_rows(got, wbfe.score(path, metrics=METRICS, device="cpu"))
