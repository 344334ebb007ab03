"""Files written by Keras itself (Keras 3 on its torch backend), not only files written with h5py in
Keras's layouts (tests/test_keras.py): `.keras`, `.weights.h5` and the legacy `.h5` of one model
score as the same weights given to wbfe as a PyTorch state dict."""

from __future__ import annotations

import importlib.util
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
