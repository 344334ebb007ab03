"""The Fashion-MNIST checkpoints wbfe ships: the default demo CNN and the model zoo.

The shipped files are read with plain ``safetensors``, rebuilt from
``benchmarks/fashion_mnist/models.py`` and, when the Debian package ``dataset-fashion-mnist`` is
installed, re-evaluated on the 10,000 test images: the recorded accuracy must come back exactly.
"""

from __future__ import annotations

import csv
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # benchmarks/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(REPO))

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from benchmarks.fashion_mnist import data as fm_data  # noqa: E402
from benchmarks.fashion_mnist.models import ArchSpec, build_model, count_params  # noqa: E402
from benchmarks.fashion_mnist.train import (  # noqa: E402
    Dataset,
    TrainConfig,
    apply_label_noise,
    evaluate,
    load_dataset,
    train,
)
from wbfe.errors import CorruptCheckpointError, InvalidOptionError, SourceNotFoundError  # noqa: E402

DEFAULT = REPO / "fixtures" / "fmnist-cnn"
ZOO = REPO / "fixtures" / "fmnist-zoo"
needs_data = pytest.mark.skipif(
    not fm_data.data_available(),
    reason="Fashion-MNIST IDX files not installed (Debian package dataset-fashion-mnist)",
)


def _metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as fh:
        return dict(fh.metadata())


def _zoo_rows() -> list[dict[str, str]]:
    with (ZOO / "zoo.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def _rebuild(path: Path) -> tuple["torch.nn.Module", dict[str, str]]:
    meta = _metadata(path)
    model = build_model(ArchSpec.from_metadata(meta))
    model.load_state_dict(load_file(str(path)), strict=True)
    return model, meta


@pytest.fixture(scope="module")
def fmnist() -> Dataset:
    torch.set_num_threads(1)
    return load_dataset(test_only=True)


# --- the default demo checkpoint -------------------------------------------------------------

def test_default_checkpoint_layout():
    path = DEFAULT / "model.safetensors"
    assert path.stat().st_size < 2 * 1024 * 1024
    tensors = load_file(str(path))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {
        "features.0.weight": (16, 1, 3, 3), "features.0.bias": (16,),
        "features.3.weight": (32, 16, 3, 3), "features.3.bias": (32,),
        "fc1.weight": (128, 32 * 7 * 7), "fc1.bias": (128,),
        "classifier.weight": (10, 128), "classifier.bias": (10,),
    }
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in tensors.values())


def test_default_metadata_matches_json_and_architecture():
    meta = _metadata(DEFAULT / "model.safetensors")
    facts = json.loads((DEFAULT / "model.json").read_text())
    for key in ("architecture", "arch", "width", "depth", "seed", "epochs", "lr", "optimizer",
                "test_accuracy", "test_loss", "test_correct", "torch_version", "script", "params"):
        assert meta[key] == facts[key], key
    assert meta["architecture"] == "cnn-w16-d2"
    assert meta["script"] == "benchmarks/train_default_fixture.py"
    assert (REPO / meta["script"]).is_file()
    model, _ = _rebuild(DEFAULT / "model.safetensors")
    # two paths to the parameter count: the shapes in the file and the closed form
    n = sum(p.numel() for p in model.parameters())
    assert n == int(meta["params"]) == count_params(ArchSpec("cnn", 16, 2)) == 206_922
    assert float(meta["test_accuracy"]) == pytest.approx(100 * int(meta["test_correct"]) / 10_000)
    assert 88.0 <= float(meta["test_accuracy"]) <= 93.0  # "about 90 %"
    assert (DEFAULT / "README.md").is_file() and "Zalando" in (DEFAULT / "LICENSE-DATA").read_text()


@needs_data
def test_default_accuracy_reproduces_on_test_set(fmnist):
    model, meta = _rebuild(DEFAULT / "model.safetensors")
    acc, loss, correct = evaluate(model, fmnist.test_x, fmnist.test_y)
    assert correct == int(meta["test_correct"])
    assert acc == pytest.approx(float(meta["test_accuracy"]), abs=0.01)
    assert loss == pytest.approx(float(meta["test_loss"]), abs=1e-5)


# --- the zoo ---------------------------------------------------------------------------------

def test_zoo_csv_lists_enough_existing_float32_models():
    rows = _zoo_rows()
    assert len(rows) >= 24
    assert len({r["model"] for r in rows}) == len(rows)
    required = {"model", "test_accuracy", "test_loss", "arch", "width", "depth", "epochs", "lr",
                "weight_decay", "label_noise", "train_size", "seed", "params", "source"}
    assert required <= set(rows[0])
    total = 0
    for row in rows:
        path = ZOO / row["model"]
        assert path.is_file(), row["model"]
        total += path.stat().st_size
        tensors = load_file(str(path))
        assert all(t.dtype == torch.float32 for t in tensors.values())
        width = int(row["width"])
        head_in = width if row["arch"] == "mlp" else 8 * width
        assert tuple(tensors["classifier.weight"].shape) == (10, head_in), row["model"]
        assert sum(t.numel() for t in tensors.values()) == int(row["params"])
        assert row["source"] == "trained by benchmarks/zoo/train_zoo.py"
    assert total <= 8 * 1024 * 1024
    assert "Zalando" in (ZOO / "LICENSE-DATA").read_text() and (ZOO / "README.md").is_file()


def test_zoo_spans_accuracies_and_settings():
    rows = _zoo_rows()
    acc = [float(r["test_accuracy"]) for r in rows]
    assert min(acc) < 75 and max(acc) > 89 and all(50 < a < 95 for a in acc)
    assert {r["arch"] for r in rows} == {"mlp", "cnn"}
    for column in ("width", "depth", "epochs", "lr", "weight_decay", "label_noise",
                   "train_size", "seed"):
        assert len({r[column] for r in rows}) >= 2, column
    assert all(int(r["params"]) <= 150_000 for r in rows)


def test_zoo_metadata_matches_csv():
    for row in _zoo_rows():
        meta = _metadata(ZOO / row["model"])
        assert meta["name"] + ".safetensors" == row["model"]
        for key in ("arch", "width", "depth", "epochs", "train_size", "seed", "params"):
            assert meta[key] == row[key], (row["model"], key)
        for key in ("lr", "weight_decay", "label_noise"):
            assert float(meta[key]) == float(row[key]), (row["model"], key)
        assert float(meta["test_accuracy"]) == pytest.approx(float(row["test_accuracy"]), abs=0.005)
        assert float(meta["test_loss"]) == pytest.approx(float(row["test_loss"]), abs=1e-6)
        spec = ArchSpec.from_metadata(meta)
        assert count_params(spec) == int(row["params"])


@needs_data
def test_zoo_accuracies_reproduce_on_test_set(fmnist):
    # Every MLP (cheap) and a spread of CNNs: keeps the test well under 30 s on a busy machine.
    rows = _zoo_rows()
    cnns = sorted((r for r in rows if r["arch"] == "cnn"), key=lambda r: float(r["test_accuracy"]))
    chosen = [r for r in rows if r["arch"] == "mlp"] + [cnns[0], cnns[len(cnns) // 2], cnns[-1]]
    for row in chosen:
        model, meta = _rebuild(ZOO / row["model"])
        acc, loss, correct = evaluate(model, fmnist.test_x, fmnist.test_y)
        assert correct == int(meta["test_correct"]), row["model"]
        assert acc == pytest.approx(float(row["test_accuracy"]), abs=0.01), row["model"]
        assert loss == pytest.approx(float(row["test_loss"]), abs=1e-5), row["model"]


# --- the building blocks ---------------------------------------------------------------------

def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_round_trip_and_errors(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "x-idx3-ubyte.gz", images)
    np.testing.assert_array_equal(fm_data.read_idx(tmp_path / "x-idx3-ubyte.gz"), images)
    (tmp_path / "bad.gz").write_bytes(gzip.compress(b"\x00\x00\x0d\x01\x00\x00\x00\x01abcd"))
    with pytest.raises(CorruptCheckpointError, match="not an unsigned-byte IDX file"):
        fm_data.read_idx(tmp_path / "bad.gz")
    (tmp_path / "short.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x05ab"))
    with pytest.raises(CorruptCheckpointError, match="has 2 bytes, header says 5"):
        fm_data.read_idx(tmp_path / "short.gz")


def test_missing_data_names_the_debian_package(tmp_path):
    with pytest.raises(SourceNotFoundError) as info:
        fm_data.load_split("test", root=tmp_path)
    assert str(info.value).endswith(
        "install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist)")
    with pytest.raises(InvalidOptionError, match="split must be one of"):
        fm_data.idx_paths("valid")


@needs_data
def test_installed_test_split_matches_published_facts():
    images, labels = fm_data.load_split("test")
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(labels), np.full(10, 1000))  # 1,000 per class


def test_label_noise_changes_exactly_the_requested_share():
    labels = np.repeat(np.arange(10), 100)
    noisy = apply_label_noise(labels, 0.3, np.random.default_rng(0))
    assert int((noisy != labels).sum()) == 300
    assert set(np.unique(noisy)) <= set(range(10))
    np.testing.assert_array_equal(apply_label_noise(labels, 0.0, np.random.default_rng(0)), labels)


@pytest.mark.parametrize("spec", [ArchSpec("mlp", 16, 1), ArchSpec("mlp", 8, 3),
                                  ArchSpec("cnn", 4, 1), ArchSpec("cnn", 16, 2),
                                  ArchSpec("cnn", 2, 4)])
def test_count_params_matches_built_model(spec):
    model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == count_params(spec)
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert list(model.state_dict())[-2:] == ["classifier.weight", "classifier.bias"]
    assert ArchSpec.from_metadata(spec.to_metadata()) == spec


def test_invalid_settings_raise_typed_errors():
    with pytest.raises(InvalidOptionError, match="unknown architecture 'resnet'"):
        ArchSpec("resnet", 8, 1)
    with pytest.raises(InvalidOptionError, match="label_noise out of range"):
        TrainConfig(ArchSpec("mlp", 8, 1), label_noise=1.0)
    with pytest.raises(InvalidOptionError, match="unknown optimizer 'lbfgs'"):
        TrainConfig(ArchSpec("mlp", 8, 1), optimizer="lbfgs")


def test_training_is_bitwise_reproducible_and_seed_dependent():
    # Synthetic stand-in data: the check is about the trainer, not about Fashion-MNIST.
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    synthetic = Dataset(torch.randn(300, 1, 28, 28, generator=gen),
                        torch.randint(0, 10, (300,), generator=gen),
                        torch.randn(100, 1, 28, 28, generator=gen),
                        torch.randint(0, 10, (100,), generator=gen))
    config = TrainConfig(ArchSpec("cnn", 2, 2), epochs=2, optimizer="sgd", lr=0.05,
                         weight_decay=1e-3, label_noise=0.2, train_size=200, batch_size=50, seed=3)
    first, second = train(config, synthetic), train(config, synthetic)
    other = train(TrainConfig(**{**config.__dict__, "seed": 4}), synthetic)
    a, b, c = (r.model.state_dict() for r in (first, second, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["classifier.weight"], c["classifier.weight"])
    assert (first.test_correct, first.test_loss) == (second.test_correct, second.test_loss)
