"""Files written by Keras itself (Keras 3 on its torch backend), not only files written with h5py in
Keras's layouts (tests/test_keras.py): `.keras`, `.weights.h5` and the legacy `.h5` of one model
score as the same weights given to wbfe as a PyTorch state dict."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import wbfe

# Found, not imported: importing keras here would pick a backend for the whole test process.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                                reason="real Keras files need keras: pip install keras (it is in the test extra)")

_SAVE = """
import sys, numpy as np, keras
keras.utils.set_random_seed(0)
m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv"), keras.layers.Flatten(),
                      keras.layers.Dense(16, name="hidden"), keras.layers.Dense(10, name="out")])
out = sys.argv[1]
m.save(out + "/model.keras"); m.save(out + "/legacy.h5"); m.save_weights(out + "/model.weights.h5")
np.savez(out + "/weights.npz", *m.get_weights())
# Two epochs of a small net with a 7-class convolutional head: every matrix has fewer than 10 eigenvalues.
e = keras.Sequential([keras.Input((12, 12, 3)), keras.layers.Conv2D(8, 3, name="c1"), keras.layers.Conv2D(8, 3, name="c2"),
                      keras.layers.GlobalAveragePooling2D(keepdims=True), keras.layers.Conv2D(7, 1, name="logits"),
                      keras.layers.Flatten()])
e.save(out + "/epoch1.keras"); np.savez(out + "/epoch1.npz", *e.get_weights())
rng = np.random.default_rng(1)
e.set_weights([w + 0.05 * rng.standard_normal(w.shape).astype(w.dtype) for w in e.get_weights()])
e.save(out + "/epoch2.keras"); np.savez(out + "/epoch2.npz", *e.get_weights())
x = keras.Input((6, 8))
r = keras.Model(x, keras.layers.Dense(3, name="o")(keras.layers.LSTM(10, name="lstm")(x)))
r.save(out + "/recurrent.keras"); r.save(out + "/recurrent.h5")
t = keras.Sequential([keras.Input((5, 8)), keras.layers.TimeDistributed(keras.layers.Dense(6), name="td"),
                      keras.layers.Dense(3, name="o")])
t.save(out + "/wrapped.keras"); np.savez(out + "/wrapped.npz", *t.get_weights())
"""


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("keras")
    # Its own process: the backend is chosen at import, and this one must not change the test process.
    env = dict(os.environ, KERAS_BACKEND="torch")
    subprocess.run([sys.executable, "-c", _SAVE, str(folder)], env=env, check=True, capture_output=True, timeout=300)
    return folder


def _reference(folder: Path) -> dict[str, float]:
    w = np.load(folder / "weights.npz")
    conv, hidden, out = w["arr_0"], w["arr_2"], w["arr_4"]  # kernels; arr_1/3/5 are biases
    state = {"conv.weight": torch.from_numpy(conv.transpose(3, 2, 0, 1).copy()),  # kh kw in out -> out in kh kw
             "hidden.weight": torch.from_numpy(hidden.T.copy()), "out.weight": torch.from_numpy(out.T.copy())}
    return {row["name"].split(".")[0]: row["bfe"] for row in wbfe.score(state, metrics="bfe").layers}


@pytest.mark.parametrize("name", ["model.keras", "model.weights.h5", "legacy.h5"])
def test_a_file_keras_wrote_scores_as_its_weights(keras_files: Path, name: str) -> None:
    result = wbfe.score(keras_files / name, metrics="bfe")
    reference = _reference(keras_files)
    assert len(result.layers) == 3 and {s["reason"] for s in result.skipped} == {"bias"}
    shapes = [row["shape"] for row in result.layers]
    assert shapes == [[4, 3, 3, 3], [16, 144], [10, 16]]  # PyTorch's out x in (x k x k)
    for row, key in zip(result.layers, ("conv", "hidden", "out")):
        assert row["bfe"] == pytest.approx(reference[key], rel=1e-12)
    assert result.summary["head"] == result.layers[-1]["name"]


def _epoch_safetensors(folder: Path, epoch: int) -> Path:
    """The epoch's kernels in PyTorch's layout, as a safetensors file."""
    from safetensors.numpy import save_file

    w = np.load(folder / f"epoch{epoch}.npz")
    names = ("c1.weight", "c2.weight", "logits.weight")  # arr_0, arr_2, arr_4; the biases between
    path = folder / f"epoch{epoch}.safetensors"
    save_file({name: np.ascontiguousarray(w[f"arr_{2 * k}"].transpose(3, 2, 0, 1)) for k, name in enumerate(names)},
              str(path))
    return path


@pytest.mark.parametrize("kind", ["keras", "safetensors"])
def test_compare_pairs_every_matrix_score_analyses(keras_files: Path, kind: str) -> None:
    """Issue 45.4: a conv net whose matrices all have fewer than min_eigs eigenvalues (8, 8 and the
    7-class conv head's 7): compare pairs the three score analyses, with score's BFE-W on each side
    and the tail fits NaN for the reason score gives, and names score's head."""
    if kind == "keras":
        a, b = keras_files / "epoch1.keras", keras_files / "epoch2.keras"
    else:
        a, b = _epoch_safetensors(keras_files, 1), _epoch_safetensors(keras_files, 2)
    score_a, score_b = wbfe.score(a), wbfe.score(b)
    assert len(score_a.layers) == 3
    result = wbfe.compare(a, b)
    assert [row["name"] for row in result.layers] == [row["name"] for row in score_a.layers]
    for row, ra, rb in zip(result.layers, score_a.layers, score_b.layers):
        assert row["bfe_a"] == pytest.approx(ra["bfe"], rel=1e-12) and row["bfe_b"] == pytest.approx(rb["bfe"], rel=1e-12)
        assert row["d_bfe"] == pytest.approx(rb["bfe"] - ra["bfe"], rel=1e-9, abs=1e-12)
        assert math.isnan(row["alpha_a"]) and math.isnan(row["d_alpha"])
        # every metric column score gives, norms included (dtype and quant are the entries' own)
        columns = [k for k in ra if f"{k}_a" in row and k not in ("dtype", "quant")]
        assert {"bfe", "log_norm", "stable_rank", "alpha"} <= set(columns)
        for k in columns:
            assert row[f"{k}_a"] == pytest.approx(ra[k], rel=1e-12, nan_ok=True), k
            assert row[f"{k}_b"] == pytest.approx(rb[k], rel=1e-12, nan_ok=True), k
        assert row["reasons"]["alpha_a"] == ra["reasons"]["alpha"] == f"too few eigenvalues for a tail fit: {ra['n_eigs']} < min_eigs=10"
        assert math.isfinite(row["rel_frobenius"]) and row["rel_frobenius"] > 0
    assert [s["reason"] for s in result.skipped] == ["A: bias; B: bias"] * (3 if kind == "keras" else 0)
    assert result.summary["head"] == score_a.summary["head"] == score_a.layers[-1]["name"]
    assert result.summary["head_source"] == score_a.summary["head_source"]


def test_a_layers_own_sublayers_are_at_its_place_in_the_order(keras_files: Path) -> None:
    """An LSTM's variables are stored in its cell's folder (layers/lstm/cell/vars/), which the model config does not
    name: they came after every layer the config names (the Dense head first), unlike the legacy .h5 of the model."""
    keras3 = wbfe.score(keras_files / "recurrent.keras", metrics="bfe")
    legacy = wbfe.score(keras_files / "recurrent.h5", metrics="bfe")
    assert [r["name"] for r in keras3.layers] == ["layers/lstm/cell/vars/0", "layers/lstm/cell/vars/1",
                                                  "layers/dense/vars/0"]
    assert [(r["shape"], r["bfe"]) for r in keras3.layers] == [(r["shape"], r["bfe"]) for r in legacy.layers]


def test_a_wrapped_layers_kernel_is_read_as_its_class(keras_files: Path) -> None:
    """TimeDistributed(Dense) in a .keras file stores the Dense's variables in layers/time_distributed/layer/vars/,
    a folder named for no class: its kernel was skipped as 'variable 0 of a 'layer' layer'. The wrapped layer's
    class comes from the model config, so it is read as the Dense kernel it is (out × in, as the .npz holds it)."""
    w = np.load(keras_files / "wrapped.npz")
    result = wbfe.score(keras_files / "wrapped.keras", metrics="bfe")
    state = {"td.weight": torch.from_numpy(w["arr_0"].T.copy()), "o.weight": torch.from_numpy(w["arr_2"].T.copy())}
    reference = wbfe.score(state, metrics="bfe").layers
    assert [r["name"] for r in result.layers] == ["layers/time_distributed/layer/vars/0", "layers/dense/vars/0"]
    assert [(r["shape"], r["bfe"]) for r in result.layers] == [(r["shape"], r["bfe"]) for r in reference]
