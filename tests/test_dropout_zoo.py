"""The Fashion-MNIST dropout zoo (fixtures/fmnist-dropout-zoo, benchmarks/zoo/train_dropout_zoo.py)
and the CIFAR ResNet definition that docs/evidence.md scores as modules.

A zoo model's BFE-W applicability, read from its rebuilt module, follows the rules: the twin with
``nn.Dropout`` before the head ``fails`` (the layer and the rate named), the one without ``holds``;
the bare file says nothing (``unknown``).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # benchmarks/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(REPO))

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import wbfe  # noqa: E402
from benchmarks.fashion_mnist import data as fm_data  # noqa: E402
from benchmarks.fashion_mnist.models import ArchSpec, build_model, count_params  # noqa: E402
from benchmarks.fashion_mnist.train import evaluate, load_dataset  # noqa: E402

ZOO = REPO / "fixtures" / "fmnist-dropout-zoo"


def _rows() -> list[dict[str, str]]:
    with (ZOO / "zoo.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def _rebuild(name: str) -> tuple[Any, dict[str, str]]:
    path = ZOO / name
    with safe_open(str(path), framework="pt") as fh:
        meta = dict(fh.metadata())
    model = build_model(ArchSpec.from_metadata(meta))
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.eval(), meta


def test_status_of_the_rebuilt_modules_follows_the_rules():
    dropped, meta = _rebuild("mlp-w32-d1-e3-drop0.5.safetensors")
    assert meta["dropout"] == "0.5"
    verdict = wbfe.score(dropped, metrics="bfe").summary["bfe_applicability"]
    assert verdict["status"] == "fails"
    assert verdict["reasons"][0].startswith("dropout on the features the head reads: dropout (rate 0.5); ")
    assert "the head classifier.weight is the last nn.Linear registered" in verdict["reasons"][0]
    cnn, _ = _rebuild("cnn-w8-d2-e2-n20000-drop0.25.safetensors")
    assert "dropout (rate 0.25)" in wbfe.score(cnn, metrics="bfe").summary["bfe_applicability"]["reasons"][0]
    twin, meta = _rebuild("mlp-w32-d1-e3.safetensors")
    assert "dropout" not in meta
    assert wbfe.score(twin, metrics="bfe").summary["bfe_applicability"]["status"] == "holds"
    # The same weights as a bare file: no description, no status.
    as_file = wbfe.score(str(ZOO / "mlp-w32-d1-e3-drop0.5.safetensors"), metrics="bfe").summary
    assert as_file["bfe_applicability"]["status"] == "unknown"
    assert as_file["bfe_head"] == wbfe.score(dropped, metrics="bfe").summary["bfe_head"]


def test_zoo_pairs_every_recipe_with_and_without_dropout():
    rows = _rows()
    assert len(rows) == 20
    with_dropout = [r for r in rows if float(r["dropout"]) > 0]
    assert len(with_dropout) == 10
    for row in with_dropout:
        twin = next(r for r in rows if r["model"] == row["model"].replace(f"-drop{float(row['dropout']):g}", ""))
        assert float(twin["dropout"]) == 0
        for key in ("arch", "width", "depth", "epochs", "lr", "label_noise", "train_size", "seed", "params"):
            assert twin[key] == row[key], (row["model"], key)
    for row in rows:
        _, meta = _rebuild(row["model"])
        assert float(meta["test_accuracy"]) == pytest.approx(float(row["test_accuracy"]), abs=0.005)
        assert count_params(ArchSpec.from_metadata(meta)) == int(row["params"])
    assert sum(p.stat().st_size for p in ZOO.iterdir()) < 5_000_000


@pytest.mark.skipif(not fm_data.data_available(),
                    reason="Fashion-MNIST IDX files not installed (Debian package dataset-fashion-mnist)")
def test_recorded_accuracies_reproduce_on_the_test_set():
    torch.set_num_threads(1)
    data = load_dataset(test_only=True)
    for row in _rows()[:4]:
        model, meta = _rebuild(row["model"])
        acc, _, correct = evaluate(model, data.test_x, data.test_y)
        assert correct == int(meta["test_correct"]), row["model"]
        assert acc == pytest.approx(float(row["test_accuracy"]), abs=0.01)


def test_cifar_resnet_definition_loads_the_shared_checkpoints_strictly():
    from wbfe.ranking.zoo import shared_zoo_dir

    from benchmarks.cifar_resnet.models import build_resnet, load_resnet

    # He et al.'s parameter counts, as the shared zoo's README states them (independent of this code).
    assert sum(p.numel() for p in build_resnet(20).parameters()) == 269_722
    assert sum(p.numel() for p in build_resnet(56).parameters()) == 853_018
    path = shared_zoo_dir() / "cifar10-resnet" / "resnet20.safetensors"
    if not path.is_file():
        pytest.skip(f"shared zoo not at {path} (set WBFE_SHARED_ZOO)")
    model = load_resnet(path)  # strict=True: every stored tensor has its module, and none is missing
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    verdict = wbfe.score(model, metrics="bfe").summary["bfe_applicability"]
    assert verdict["status"] == "holds" and "linear.weight" in verdict["reasons"][0]
