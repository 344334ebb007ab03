"""Keras weights written with h5py in Keras's own layouts (Keras 2 ``model.save("m.h5")`` and
``save_weights``, Keras 3 ``.keras`` archives) score exactly as the PyTorch model they were
converted from. (Keras itself is not installed here: the files follow keras' saving code,
``legacy_h5_format.save_weights_to_hdf5_group`` and ``saving_lib`` / ``H5IOStore``.)"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import wbfe
from wbfe.errors import CorruptCheckpointError, MissingDependencyError, TruncatedCheckpointError
from wbfe_cli.main import app

h5py = pytest.importorskip("h5py")


def torch_model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) / 4

    return {
        "conv1.weight": r(16, 3, 3, 3), "conv1.bias": r(16),
        "bn.weight": 1 + r(16), "bn.bias": r(16), "bn.running_mean": r(16), "bn.running_var": 1 + r(16).abs(),
        "dw.weight": r(32, 1, 3, 3), "dw.bias": r(32),  # depthwise: 16 channels × multiplier 2
        "pw.weight": r(24, 32, 1, 1), "pw.bias": r(24),
        "fc1.weight": r(64, 96), "fc1.bias": r(64),
        "fc2.weight": r(10, 64), "fc2.bias": r(10),
        "emb.weight": r(50, 24),
    }


def to_keras(name: str, t: torch.Tensor) -> np.ndarray:
    """A PyTorch weight in Keras's storage layout."""
    if name == "dw.weight":  # (in·mult, 1, kh, kw) -> (kh, kw, in, mult)
        return t.reshape(16, 2, 3, 3).permute(2, 3, 0, 1).numpy().copy()
    if t.ndim == 4:  # (out, in, kh, kw) -> (kh, kw, in, out)
        return t.permute(2, 3, 1, 0).numpy().copy()
    if t.ndim == 2 and not name.startswith("emb"):
        return t.T.numpy().copy()
    return t.numpy().copy()


# Keras layers of the model: (layer name, class, [(variable, torch tensor name)])
LAYERS = [
    ("embedding", "Embedding", [("embeddings", "emb.weight")]),
    ("conv2d", "Conv2D", [("kernel", "conv1.weight"), ("bias", "conv1.bias")]),
    ("batch_normalization", "BatchNormalization", [("gamma", "bn.weight"), ("beta", "bn.bias"),
                                                   ("moving_mean", "bn.running_mean"),
                                                   ("moving_variance", "bn.running_var")]),
    ("depthwise_conv2d", "DepthwiseConv2D", [("depthwise_kernel", "dw.weight"), ("bias", "dw.bias")]),
    ("conv2d_1", "Conv2D", [("kernel", "pw.weight"), ("bias", "pw.bias")]),
    ("flatten", "Flatten", []),
    ("dense", "Dense", [("kernel", "fc1.weight"), ("bias", "fc1.bias")]),
    ("dense_1", "Dense", [("kernel", "fc2.weight"), ("bias", "fc2.bias")]),
]
MATRICES = {"conv1.weight", "dw.weight", "pw.weight", "fc1.weight", "fc2.weight", "emb.weight"}


def model_config() -> dict:
    return {"class_name": "Sequential", "config": {"name": "sequential", "layers": [
        {"module": "keras.layers", "class_name": cls, "config": {"name": name}} for name, cls, _ in LAYERS]}}


def _names_attr(group: h5py.Group, key: str, names: list[str]) -> None:
    group.attrs[key] = np.array([n.encode("utf8") for n in names], dtype="S") if names else np.array([], "S1")


def write_keras2_h5(path: Path, state: dict[str, torch.Tensor], *, full_model: bool = True) -> Path:
    """keras 2 ``model.save("m.h5")`` (``full_model``) or ``model.save_weights("w.h5")``."""
    with h5py.File(path, "w") as f:
        if full_model:
            f.attrs["backend"] = b"tensorflow"
            f.attrs["keras_version"] = b"2.15.0"
            f.attrs["model_config"] = json.dumps(model_config()).encode("utf8")
            root = f.create_group("model_weights")
        else:
            root = f
        _names_attr(root, "layer_names", [name for name, _, _ in LAYERS])
        root.attrs["backend"] = b"tensorflow"
        root.attrs["keras_version"] = b"2.15.0"
        optimizer_names = ["Adam/iter:0"]
        for name, _, variables in sorted(LAYERS):  # keras sorts the groups by layer name
            group = root.create_group(name)
            weight_names = [f"{name}/{var}:0" for var, _ in variables]
            _names_attr(group, "weight_names", weight_names)
            for weight, (_, tensor_name) in zip(weight_names, variables):
                group.create_dataset(weight, data=to_keras(tensor_name, state[tensor_name]))
                if not weight.endswith(("moving_mean:0", "moving_variance:0")):
                    optimizer_names += [f"Adam/{weight[:-2]}/m:0", f"Adam/{weight[:-2]}/v:0"]
        if full_model:
            opt = f.create_group("optimizer_weights")
            _names_attr(opt, "weight_names", optimizer_names)
            opt.create_dataset("Adam/iter:0", data=np.int64(100))
            for weight in optimizer_names[1:]:
                layer, var = weight.split("/")[1:3]
                tensor_name = dict(next(v for n, _, v in LAYERS if n == layer))[var]
                opt.create_dataset(weight, data=np.zeros_like(to_keras(tensor_name, state[tensor_name])) + 1e-3)
    return path


def keras3_weights(state: dict[str, torch.Tensor]) -> bytes:
    """``model.weights.h5`` as keras 3's H5IOStore writes it (layer folders named by class)."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.create_group("vars")
        for folder, variables in keras3_folders():
            group = f.create_group(folder).create_group("vars")
            for i, (_, tensor_name) in enumerate(variables):
                group[str(i)] = to_keras(tensor_name, state[tensor_name])
        opt = f.create_group("optimizer").create_group("vars")
        opt["0"] = np.int64(100)
        opt["1"] = np.float32(1e-3)
        for i, name in enumerate(n for n in state if "running" not in n):
            opt[str(2 + i)] = np.zeros_like(to_keras(name, state[name]))
    return buffer.getvalue()


def write_keras3(path: Path, state: dict[str, torch.Tensor]) -> Path:
    """keras 3 ``model.save("m.keras")``: a zip (stored, as saving_lib writes it)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("metadata.json", json.dumps({"keras_version": "3.3.3", "date_saved": "2024-05-01@12:00:00"}))
        config = model_config()
        config["config"]["layers"].insert(0, {"class_name": "InputLayer", "config": {"name": "input_layer"}})
        zf.writestr("config.json", json.dumps(config))
        zf.writestr("model.weights.h5", keras3_weights(state))
    return path


def keras2_names() -> dict[str, str]:
    return {f"{layer}/{var}:0": tensor for layer, _, variables in LAYERS for var, tensor in variables}


def keras3_folders() -> list[tuple[str, list[tuple[str, str]]]]:
    """Each layer's folder as keras 3's saving_lib names it (class in snake case, numbered per class)."""
    snake = {"Conv2D": "conv2d", "BatchNormalization": "batch_normalization", "DepthwiseConv2D": "depthwise_conv2d",
             "Flatten": "flatten", "Dense": "dense", "Embedding": "embedding"}
    out, used = [], {}
    for _, cls, variables in LAYERS:
        used[snake[cls]] = used.get(snake[cls], -1) + 1
        out.append((f"layers/{snake[cls]}" + (f"_{used[snake[cls]]}" if used[snake[cls]] else ""), variables))
    return out


def keras3_names() -> dict[str, str]:
    return {f"{folder}/vars/{i}": tensor for folder, variables in keras3_folders()
            for i, (_, tensor) in enumerate(variables)}


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return torch_model()


@pytest.mark.parametrize("kind", ["keras2-model", "keras2-weights", "keras3"])
@pytest.mark.parametrize("conv", ["flatten", "slices"])
def test_scores_exactly_as_the_pytorch_original(tmp_path: Path, state: dict, kind: str, conv: str) -> None:
    if kind == "keras3":
        path, names = write_keras3(tmp_path / "m.keras", state), keras3_names()
    else:
        path = write_keras2_h5(tmp_path / "m.h5", state, full_model=kind == "keras2-model")
        names = keras2_names()
    got = wbfe.score(path, metrics="bfe", conv=conv)
    want = {row["name"]: row for row in wbfe.score(state, metrics="bfe", conv=conv).layers}
    rows = {names[row["name"]]: row for row in got.layers}
    assert set(rows) == MATRICES
    for tensor_name, row in rows.items():
        assert row["bfe"] == want[tensor_name]["bfe"], tensor_name
        assert row["shape"] == list(state[tensor_name].shape)  # out × in (× k…), as PyTorch holds it
        assert (row["rows"], row["cols"], row["n_slices"]) == (
            want[tensor_name]["rows"], want[tensor_name]["cols"], want[tensor_name]["n_slices"])
    reasons = {names.get(s["name"], s["name"]): s["reason"] for s in got.skipped}
    assert reasons["conv1.bias"] == "bias"
    assert "BatchNorm moving statistic" in reasons["bn.running_mean"]
    assert "BatchNorm moving statistic" in reasons["bn.running_var"]
    optimizer = [r for n, r in reasons.items() if n not in state]
    assert len(optimizer) == (0 if kind == "keras2-weights" else 2 + 13 if kind == "keras3" else 1 + 2 * 13)
    assert all(r.startswith("optimizer state") for r in optimizer)
    # every stored dataset accounted for
    with h5py.File(path if kind != "keras3" else io.BytesIO(zipfile.ZipFile(path).read("model.weights.h5"))) as f:
        stored: list[str] = []
        f.visititems(lambda n, o: stored.append(n) if isinstance(o, h5py.Dataset) else None)
    assert len(got.layers) + len(got.skipped) == len(stored)
    head = {"keras2-model": "dense_1/kernel:0", "keras2-weights": "dense_1/kernel:0", "keras3": "layers/dense_1/vars/0"}
    # The model config's output layer (none in a bare save_weights file: then the shapes decide).
    source = "structure" if kind == "keras2-weights" else "framework"
    assert got.summary["head"] == head[kind] and got.summary["head_source"] == source
    assert got.model["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert got.model["format"] == {"keras2-model": "keras-h5", "keras2-weights": "keras-h5", "keras3": "keras3"}[kind]
    if kind != "keras2-weights":
        assert got.model["metadata"]["keras_version"] == ("3.3.3" if kind == "keras3" else "2.15.0")


def test_names_as_stored(tmp_path: Path, state: dict) -> None:
    got = wbfe.score(write_keras2_h5(tmp_path / "m.h5", state), metrics="bfe")
    assert [row["name"] for row in got.layers] == [
        "embedding/embeddings:0", "conv2d/kernel:0", "depthwise_conv2d/depthwise_kernel:0", "conv2d_1/kernel:0", "dense/kernel:0",
        "dense_1/kernel:0"]


def test_picked_by_magic_bytes_whatever_the_name(tmp_path: Path, state: dict) -> None:
    h5 = write_keras2_h5(tmp_path / "m.h5", state)
    archive = write_keras3(tmp_path / "m.keras", state)
    for original, alias in ((h5, "weights.bin"), (archive, "model.zip")):
        copy = tmp_path / alias
        copy.write_bytes(original.read_bytes())
        assert ([r["bfe"] for r in wbfe.score(copy, metrics="bfe").layers]
                == [r["bfe"] for r in wbfe.score(original, metrics="bfe").layers])
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "m.keras").write_bytes(archive.read_bytes())
    assert wbfe.score(folder, metrics="bfe").model["format"] == "keras3"


def test_keras3_bfloat16_variables(tmp_path: Path) -> None:
    """keras 3 writes a bfloat16 variable as 2-byte opaque values with attrs["dtype"] = "bfloat16"."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    w = (torch.randn(12, 40, generator=torch.Generator().manual_seed(2)) / 6).to(torch.bfloat16)
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        ds = f.create_group("layers/dense").create_group("vars").create_dataset(
            "0", data=w.float().numpy().T.astype(ml_dtypes.bfloat16))
        ds.attrs["dtype"] = "bfloat16"
    path = tmp_path / "m.weights.h5"
    path.write_bytes(buffer.getvalue())
    (row,) = wbfe.score(path, metrics="bfe").layers
    assert row["dtype"] == "bfloat16" and row["shape"] == [12, 40]
    assert row["bfe"] == wbfe.score({"w": w}, metrics="bfe").layers[0]["bfe"]


# ---- bad input ---------------------------------------------------------------------------------

def _cli(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["score", str(path), "--metrics", "bfe"])
    return result.exit_code, result.stderr


@pytest.mark.parametrize("damage", ["truncated", "bad-magic", "data-out-of-range", "keras3-truncated",
                                    "keras3-no-weights", "not-keras-hdf5"])
def test_bad_files_get_a_typed_error_and_exit_2(tmp_path: Path, state: dict, damage: str) -> None:
    expected: type[Exception] = CorruptCheckpointError
    if damage.startswith("keras3"):
        path = write_keras3(tmp_path / "m.keras", state)
        raw = path.read_bytes()
        if damage == "keras3-truncated":
            path.write_bytes(raw[: len(raw) // 2])
        else:
            with zipfile.ZipFile(path, "w") as zf:
                zf.writestr("config.json", "{}")
                zf.writestr("metadata.json", "{}")
    elif damage == "not-keras-hdf5":
        path = tmp_path / "data.h5"
        with h5py.File(path, "w") as f:
            f["x"] = np.zeros((4, 4))
    else:
        path = write_keras2_h5(tmp_path / "m.h5", state)
        raw = bytearray(path.read_bytes())
        if damage == "truncated":
            raw = raw[: len(raw) // 2]
            expected = TruncatedCheckpointError
        elif damage == "bad-magic":
            raw[:8] = b"\x89HDX\r\n\x1a\n"
        else:
            # Cut the last dataset's bytes off and make the superblock (v0: end-of-file address at
            # byte 40) agree, so that HDF5 opens the file and only the data lies out of range.
            with h5py.File(path) as f:
                ends: list[int] = []
                f.visititems(lambda n, o: ends.append(o.id.get_offset() + o.id.get_storage_size())
                             if isinstance(o, h5py.Dataset) and o.id.get_offset() is not None else None)
            end = max(ends)
            assert end == len(raw)
            raw = raw[: end - 100]
            raw[40:48] = struct.pack("<Q", len(raw))
            expected = TruncatedCheckpointError
        path.write_bytes(bytes(raw))
    with pytest.raises(expected) as info:
        wbfe.score(path, metrics="bfe")
    assert str(path) in str(info.value)
    code, err = _cli(path)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_missing_h5py_names_the_extra(tmp_path: Path, state: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    path = write_keras2_h5(tmp_path / "m.h5", state)
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'wbfe\[keras\]'"):
        wbfe.score(path, metrics="bfe")
    code, err = _cli(path)
    assert code == 2 and "pip install 'wbfe[keras]'" in err


def test_a_damaged_stored_weights_member_fails_its_crc(tmp_path: Path, state: dict) -> None:
    # Found by fuzzing: the stored model.weights.h5 is read in place, past zipfile's CRC-32 check;
    # one flipped byte of a variable's data was read as the model's numbers.
    import zipfile

    path = write_keras3(tmp_path / "m.keras", state)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("model.weights.h5")
    raw = bytearray(path.read_bytes())
    raw[info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size - 8] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match="fails its CRC-32 check"):
        wbfe.score(path, metrics="bfe")


def test_a_stored_weights_member_whose_local_header_names_another_file_is_refused(tmp_path: Path, state: dict) -> None:
    # Found by fuzzing (tests/fuzz_corpus/keras/local-header-name-differs-*): read in place, the
    # member skipped zipfile's check that its local header names the file the directory names;
    # zipfile (and so Keras) refuses such an archive, the reader read it.
    import zipfile

    path = write_keras3(tmp_path / "m.keras", state)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("model.weights.h5")
    raw = bytearray(path.read_bytes())
    assert raw[info.header_offset + 30:info.header_offset + 30 + len(info.filename)] == b"model.weights.h5"
    raw[info.header_offset + 30 + 3] = ord("m")  # "modml.weights.h5": the fuzzer's change
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match=r"File name in directory 'model.weights.h5' and header"):
        wbfe.score(path, metrics="bfe")


@pytest.mark.parametrize("kind", ["keras2", "keras3"])
def test_a_model_config_whose_layer_config_is_not_a_mapping_leaves_that_layer_to_the_rules(
        tmp_path: Path, state: dict, kind: str) -> None:
    """A damaged model config (a layer's ``config`` null or a number) raised AttributeError from the planner."""
    config = model_config()
    config["config"]["layers"][0]["config"] = None
    config["config"]["layers"][1]["config"] = 3
    if kind == "keras2":
        path = write_keras2_h5(tmp_path / "m.h5", state)
        with h5py.File(path, "r+") as f:
            f.attrs["model_config"] = json.dumps(config).encode("utf8")
    else:
        path = write_keras3(tmp_path / "m.keras", state)
        with zipfile.ZipFile(path) as zf:
            members = {name: zf.read(name) for name in zf.namelist()}
        config["config"]["layers"].insert(0, {"class_name": "InputLayer", "config": {"name": "input_layer"}})
        members["config.json"] = json.dumps(config).encode("utf8")
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data)
    result = wbfe.score(path, metrics="bfe")
    names = keras2_names() if kind == "keras2" else keras3_names()
    assert {names[r["name"]] for r in result.layers} == MATRICES


@pytest.mark.parametrize(("key", "value"), [("layer_names", 5), ("layer_names", "dense"), ("weight_names", 7),
                                            ("layer_names", np.array([1.5, 2.5]))])
def test_a_names_attribute_that_is_not_a_list_of_names_is_refused_with_exit_2(
        tmp_path: Path, state: dict, key: str, value: object) -> None:
    """A scalar number raised TypeError ('numpy.int64' object is not iterable); a scalar name was read letter by
    letter ("layer 'd' listed in layer_names is missing")."""
    path = write_keras2_h5(tmp_path / "m.h5", state)
    with h5py.File(path, "r+") as f:
        group = f["model_weights"] if key == "layer_names" else f["model_weights/dense"]
        group.attrs[key] = value
    with pytest.raises(CorruptCheckpointError, match=f"corrupt HDF5 file \\(its {key} attribute is not a list"):
        wbfe.score(path, metrics="bfe")
    code, err = _cli(path)
    assert code == 2 and f"its {key} attribute is not a list of names" in err and "Traceback" not in err


@pytest.mark.parametrize("edge", ["null-dataspace", "nothing-written"])
def test_a_kernel_with_no_values_stored_is_skipped_saying_why(tmp_path: Path, state: dict, edge: str) -> None:
    """A dataset with no dataspace (h5py.Empty) raised TypeError when planned; a chunked one declared 2^20 × 2^20
    with no chunk written (a 16 KB file) was read as 4 TiB of fill values, MemoryError. Each is skipped saying why,
    the rest scored as before."""
    path = write_keras2_h5(tmp_path / "m.h5", state, full_model=False)
    want = {r["name"]: r["bfe"] for r in wbfe.score(path, metrics="bfe").layers}
    with h5py.File(path, "a") as f:
        del f["dense/dense/kernel:0"]
        if edge == "null-dataspace":
            f.create_dataset("dense/dense/kernel:0", data=h5py.Empty("f4"))
        else:
            f.create_dataset("dense/dense/kernel:0", shape=(1 << 20, 1 << 20), dtype="f4", chunks=(64, 64))
    got = wbfe.score(path, metrics="bfe")
    reasons = {s["name"]: (s["shape"], s["reason"]) for s in got.skipped}
    assert reasons["dense/kernel:0"] == (
        ([], "an HDF5 dataset with no dataspace: it holds no values") if edge == "null-dataspace" else
        ([1 << 20, 1 << 20], "no values stored: every element is the HDF5 fill value (0.0)"))
    assert {r["name"]: r["bfe"] for r in got.layers} == {k: v for k, v in want.items() if k != "dense/kernel:0"}
    if edge == "null-dataspace":  # what copies every tensor (prune, smooth) is refused in one line
        from wbfe.sources import open_source

        with open_source(path) as source, pytest.raises(CorruptCheckpointError, match="no dataspace: it holds no"):
            next(e for e in source.entries() if e.name == "dense/kernel:0").load()


@pytest.mark.parametrize("kind", ["keras2", "keras3"])
def test_the_head_is_walked_once_per_open(tmp_path: Path, state: dict, monkeypatch: pytest.MonkeyPatch,
                                          kind: str) -> None:
    """One walk of the model config finds the head's stored matrix and the description's facts (it was walked for
    each), and both still name the last Dense layer."""
    from wbfe.framework import keras_graph
    from wbfe.sources import keras_files, open_source

    walks = []
    original = keras_graph.keras_head

    def counted(config, prefix=(), seen=None):  # type: ignore[no-untyped-def]
        walks.extend([prefix] if not prefix else [])
        return original(config, prefix, seen)

    monkeypatch.setattr(keras_graph, "keras_head", counted)
    monkeypatch.setattr(keras_files, "keras_head", counted)
    path = (write_keras2_h5(tmp_path / "m.h5", state) if kind == "keras2" else write_keras3(tmp_path / "m.keras", state))
    with open_source(path) as source:
        description = source.description
    assert walks == [()]
    assert description is not None and description.facts == {"family": "keras", "head_class": "Dense", "dropout": []}
    assert description.head == ("dense_1/kernel:0" if kind == "keras2" else "layers/dense_1/vars/0")


@pytest.mark.parametrize("how", ["external-link", "external-storage", "virtual", "soft-link-to-external"])
@pytest.mark.parametrize("layout", ["keras2", "keras3-weights"])
def test_a_dataset_whose_data_lies_in_another_file_is_refused(tmp_path: Path, state: dict, how: str,
                                                              layout: str) -> None:
    """HDF5 follows an external link into another file, reads external storage from a raw file and a virtual dataset
    from other files: each kernel was read and scored as the file's own (the other file named by the file, never by
    the user)."""
    outside = to_keras("fc1.weight", state["fc1.weight"]) * 3
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["data"] = outside
    outside.tofile(tmp_path / "other.raw")
    if layout == "keras2":
        path = write_keras2_h5(tmp_path / "m.h5", state)
    else:
        path = tmp_path / "m.weights.h5"
        path.write_bytes(keras3_weights(state))
    with h5py.File(path, "a") as f:
        found: list[str] = []
        f.visititems(lambda name, obj: found.append(name) if getattr(obj, "shape", None) == outside.shape else None)
        target = found[0]  # fc1's kernel
        del f[target]
        if how == "external-link":
            f[target] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/data")
        elif how == "soft-link-to-external":
            f["elsewhere"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/")
            f[target] = h5py.SoftLink("/elsewhere/data")
        elif how == "external-storage":
            f.create_dataset(target, shape=outside.shape, dtype=outside.dtype,
                             external=[(str(tmp_path / "other.raw"), 0, outside.nbytes)])
        else:
            virtual = h5py.VirtualLayout(shape=outside.shape, dtype=outside.dtype)
            virtual[:] = h5py.VirtualSource(str(tmp_path / "other.h5"), "data", shape=outside.shape)
            f.create_virtual_dataset(target, virtual)
    with pytest.raises(CorruptCheckpointError, match=r"wbfe reads only the file named") as info:
        wbfe.score(path, metrics="bfe")
    assert repr("elsewhere" if how == "soft-link-to-external" else target) in str(info.value)
    result = CliRunner().invoke(app, ["score", str(path), "--metrics", "bfe"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("where", ["layer_names", "weight_names"])
def test_a_layer_or_weight_listed_twice_is_refused(tmp_path: Path, state: dict, where: str) -> None:
    """Each copy of the name was another row of the one dataset ('dense/kernel:0 tied: identical to dense/kernel:0',
    four rows of one kernel listed twice in both); Keras refuses a model whose layer names repeat."""
    path = write_keras2_h5(tmp_path / "m.h5", state)
    with h5py.File(path, "a") as f:
        root = f["model_weights"]
        layer = _attr_list_of(root, "layer_names")[-1]
        group = root if where == "layer_names" else root[layer]
        names = _attr_list_of(group, where)
        _names_attr(group, where, names + names[-1:])
    with pytest.raises(CorruptCheckpointError, match="listed twice"):
        wbfe.score(path, metrics="bfe")
    code, err = _cli(path)
    assert code == 2 and err.count("\n") == 1 and "listed twice" in err, err


def _attr_list_of(group: h5py.Group, key: str) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in group.attrs[key]]
