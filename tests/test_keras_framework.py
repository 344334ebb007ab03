"""Files written by Keras itself (Keras 3, torch backend): the head is the layer that produces the
model's output, read from the file's own model config, without --head: a Dense head, SqueezeNet's
1 x 1 and mini-Xception's 3 x 3 convolution before global pooling, a SeparableConv2D head, a
DepthwiseConv2D model, a backbone nested in a Sequential and a Sequential nested in a Functional
model; in .keras and legacy .h5. The rows come in the model's order (``model.weights``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import wbfe
from wbfe.metrics.bfe import bfe_from_moments

# Found, not imported: importing keras here would pick a backend for the whole test process.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                                reason="real Keras files need keras: pip install keras (it is in the test extra)")

_SAVE = """
import json, sys
import numpy as np
import keras
from keras import layers as L

keras.utils.set_random_seed(0)
out = sys.argv[1]


def dense_head():
    return keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(4, 3), L.Flatten(), L.Dense(16),
                             L.Dense(10, name="head")], name="dense_head")


def squeeze_1x1():  # SqueezeNet's end: fire module (concat), 1x1 conv to the classes, ReLU, GAP, softmax
    i = keras.Input((16, 16, 3))
    x = L.Conv2D(16, 3, activation="relu")(i)
    s = L.Conv2D(8, 1, activation="relu")(x)
    x = L.Concatenate()([L.Conv2D(16, 1)(s), L.Conv2D(16, 3, padding="same")(s)])
    x = L.Dropout(0.5)(x)
    x = L.Conv2D(10, 1, name="head")(x)
    x = L.Activation("relu")(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(i, L.Activation("softmax")(x), name="squeeze")


def xception_kxk():  # mini-Xception's end: separable residual block, 3x3 conv to the classes, GAP
    i = keras.Input((16, 16, 3))
    x = L.Conv2D(8, 3, padding="same")(i)
    r = L.Conv2D(16, 1, strides=2, padding="same")(x)
    y = L.SeparableConv2D(16, 3, padding="same")(x)
    y = L.BatchNormalization()(y)
    y = L.MaxPooling2D(3, strides=2, padding="same")(y)
    x = L.Add()([y, r])
    x = L.Conv2D(7, 3, padding="same", name="head")(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(i, L.Activation("softmax", name="predictions")(x), name="mini_xception")


def separable_head():
    return keras.Sequential([keras.Input((16, 16, 3)), L.Conv2D(8, 3), L.SeparableConv2D(16, 3),
                             L.SeparableConv2D(6, 3, name="head"), L.GlobalMaxPooling2D()], name="sep")


def depthwise():
    return keras.Sequential([keras.Input((16, 16, 3)), L.Conv2D(8, 3), L.DepthwiseConv2D(3, depth_multiplier=2),
                             L.Conv2D(12, 1), L.GlobalAveragePooling2D(), L.Dense(9, name="head")], name="dw")


def nested_sequential():
    i = keras.Input((16, 16, 3))
    backbone = keras.Model(i, L.Conv2D(12, 3)(L.Conv2D(8, 3)(i)), name="backbone")
    return keras.Sequential([keras.Input((16, 16, 3)), backbone, L.GlobalAveragePooling2D(), L.Dropout(0.1),
                             L.Dense(5, name="head")], name="outer")


def nested_functional():
    backbone = keras.Sequential([keras.Input((16, 16, 3)), L.Conv2D(8, 3), L.DepthwiseConv2D(3)], name="trunk")
    i = keras.Input((16, 16, 3))
    x = L.Conv2D(6, 1, name="head")(backbone(i))
    return keras.Model(i, L.Flatten()(L.GlobalAveragePooling2D()(x)), name="wrapped")


info = {}
for build in (dense_head, squeeze_1x1, xception_kxk, separable_head, depthwise, nested_sequential, nested_functional):
    m = build()
    name = build.__name__
    m.save(f"{out}/{name}.keras")
    m.save(f"{out}/{name}.h5")
    head = m.get_layer("head")
    kernel = head.pointwise_kernel if hasattr(head, "pointwise_kernel") else head.kernel
    np.save(f"{out}/{name}.head.npy", np.asarray(keras.ops.convert_to_numpy(kernel)))
    info[name] = [v.path for v in m.weights]
json.dump(info, open(f"{out}/paths.json", "w"))
"""
MODELS = ["dense_head", "squeeze_1x1", "xception_kxk", "separable_head", "depthwise", "nested_sequential",
          "nested_functional"]
_KERNELS = ("kernel", "depthwise_kernel", "pointwise_kernel")


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("keras-framework")
    env = dict(os.environ, KERAS_BACKEND="torch")  # its own process: Keras picks its backend at import
    subprocess.run([sys.executable, "-c", _SAVE, str(folder)], env=env, check=True, capture_output=True, timeout=300)
    return folder


def _bfe_of_keras_kernel(kernel: np.ndarray) -> float:
    """BFE-W of a Keras kernel (k... x in x out) as an out x (k... in) matrix, computed here."""
    w = kernel.astype(np.float64).reshape(-1, kernel.shape[-1]).T
    e = np.linalg.eigvalsh(w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w)
    return bfe_from_moments(float(e.mean()), float(np.log(e).mean()), "opt")[0]


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
@pytest.mark.parametrize("model", MODELS)
def test_head_is_the_models_output_layer(keras_files: Path, model: str, suffix: str) -> None:
    result = wbfe.score(keras_files / f"{model}{suffix}", metrics="bfe")
    summary = result.summary
    assert summary["head_source"] == "framework", (summary["head"], summary.get("head_note"), result.model)
    assert result.model["framework"]["used"] == "keras"
    head = next(row for row in result.layers if row["name"] == summary["head"])
    # The head's numbers are those of the kernel Keras itself holds for the layer named "head".
    assert head["bfe"] == pytest.approx(_bfe_of_keras_kernel(np.load(keras_files / f"{model}.head.npy")), rel=1e-9)
    if suffix == ".h5":  # Keras 3's legacy .h5 names each weight by its variable path
        assert "head" in summary["head"].split("/")
        paths = json.loads((keras_files / "paths.json").read_text())[model]
        kernels = [p for p in paths if p.split("/")[-1] in _KERNELS]
        assert [row["name"] for row in result.layers] == kernels  # model.weights order


def test_depthwise_kernels_of_legacy_h5_are_read_as_depthwise(keras_files: Path) -> None:
    """Keras 3's .h5 calls a DepthwiseConv2D's variable ``kernel``: (kh, kw, in, mult) -> in*mult x 1 x kh x kw."""
    rows = {row["name"]: row for row in wbfe.score(keras_files / "depthwise.h5", metrics="bfe").layers}
    depthwise = next(row for name, row in rows.items() if "depthwise_conv2d" in name)
    assert depthwise["shape"] == [16, 1, 3, 3] and (depthwise["rows"], depthwise["cols"]) == (16, 9)
    same = next(row for row in wbfe.score(keras_files / "depthwise.keras", metrics="bfe").layers
                if "depthwise_conv2d" in row["name"])
    assert depthwise["bfe"] == pytest.approx(same["bfe"], rel=1e-12)
