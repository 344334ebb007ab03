"""The format, folder and location registries (wbfe/sources/registry.py).

Every registered format is tested here automatically: ``WRITERS`` must hold a writer of a tiny
checkpoint of that format (written by the format's own library, or by hand to its specification),
and the test reads it back, as a file and as a folder, and compares every tensor with the arrays it
was written from. A format registered without a writer fails ``test_every_format_has_a_writer``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from wbfe.errors import CorruptCheckpointError, SourceNotFoundError
from wbfe.linalg.arrays import to_torch
from wbfe.sources import CHECKPOINT_SUFFIXES, open_source
from wbfe.sources.local import pick_weight_files
from wbfe.sources.registry import file_formats, format_of, locations

Expected = dict[str, torch.Tensor]
Writer = Callable[[Path], tuple[Path, Expected]]


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Two out × in float32 matrices with distinct shapes, seeded."""
    rng = np.random.default_rng(seed)
    return {"fc1.weight": rng.standard_normal((6, 4)).astype(np.float32),
            "fc2.weight": rng.standard_normal((3, 6)).astype(np.float32)}


def write_safetensors(folder: Path) -> tuple[Path, Expected]:
    from safetensors.numpy import save_file

    w = _weights()
    save_file(w, str(folder / "model.safetensors"))
    return folder / "model.safetensors", {k: torch.from_numpy(v) for k, v in w.items()}


def write_torch(folder: Path) -> tuple[Path, Expected]:
    w = {k: torch.from_numpy(v) for k, v in _weights(1).items()}
    torch.save(w, folder / "model.pt")
    return folder / "model.pt", w


def write_gguf(folder: Path) -> tuple[Path, Expected]:
    gguf = pytest.importorskip("gguf")
    w = _weights(2)
    writer = gguf.GGUFWriter(str(folder / "model.gguf"), arch="llama")
    for name, array in w.items():
        writer.add_tensor(name, array)  # GGUF keeps ne0 = in: read back out × in
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder / "model.gguf", {k: torch.from_numpy(v) for k, v in w.items()}


def write_keras(folder: Path) -> tuple[Path, Expected]:
    """A Keras 2 ``save_weights`` HDF5 file: two Dense kernels, stored in × out."""
    h5py = pytest.importorskip("h5py")
    w = _weights(3)
    layers = {"dense": w["fc1.weight"], "dense_1": w["fc2.weight"]}
    with h5py.File(folder / "model.h5", "w") as f:
        f.attrs["layer_names"] = np.array([n.encode() for n in layers], dtype="S")
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.15.0"
        for name, weight in layers.items():
            group = f.create_group(name)
            group.attrs["weight_names"] = np.array([f"{name}/kernel:0".encode()], dtype="S")
            group.create_dataset(f"{name}/kernel:0", data=weight.T.copy())
    return folder / "model.h5", {f"{n}/kernel:0": torch.from_numpy(v) for n, v in layers.items()}


def write_onnx(folder: Path) -> tuple[Path, Expected]:
    """x @ B1 -> Gemm(transB=1) with W2: B1 stored in × out, W2 out × in."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = _weights(4)
    b1 = numpy_helper.from_array(w["fc1.weight"].T.copy(), "fc1.weight")
    w2 = numpy_helper.from_array(w["fc2.weight"], "fc2.weight")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "fc1.weight"], ["h"], name="fc1"),
         helper.make_node("Gemm", ["h", "fc2.weight"], ["y"], name="fc2", transB=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [b1, w2])
    onnx.save(helper.make_model(graph), str(folder / "model.onnx"))
    return folder / "model.onnx", {k: torch.from_numpy(v) for k, v in w.items()}


class _Scriptable(torch.nn.Module):
    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6, bias=False)
        self.fc2 = torch.nn.Linear(6, 3, bias=False)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.from_numpy(weights["fc1.weight"]))
            self.fc2.weight.copy_(torch.from_numpy(weights["fc2.weight"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


def write_torchscript(folder: Path) -> tuple[Path, Expected]:
    import warnings

    w = _weights(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(_Scriptable(w)), str(folder / "model.jit"))
    return folder / "model.jit", {k: torch.from_numpy(v) for k, v in w.items()}


def write_npz(folder: Path) -> tuple[Path, Expected]:
    w = _weights(6)
    np.savez(folder / "model.npz", **w)
    return folder / "model.npz", {k: torch.from_numpy(v) for k, v in w.items()}


def write_flax(folder: Path) -> tuple[Path, Expected]:
    """Dense kernels (in × out) as flax.serialization writes them: msgpack extension type 1."""
    msgpack = pytest.importorskip("msgpack")
    w = _weights(7)

    def ext(a: np.ndarray) -> object:
        return msgpack.ExtType(1, msgpack.packb((a.shape, a.dtype.name, a.tobytes()), use_bin_type=True))

    tree = {"fc1": {"kernel": ext(w["fc1.weight"].T.copy())}, "fc2": {"kernel": ext(w["fc2.weight"].T.copy())}}
    (folder / "flax_model.msgpack").write_bytes(msgpack.packb(tree))
    return folder / "flax_model.msgpack", {k: torch.from_numpy(v) for k, v in w.items()}


def write_tflite(folder: Path) -> tuple[Path, Expected]:
    """Two FULLY_CONNECTED ops (weights out × in), written from TFLite's schema (tests/tflite_writer.py)."""
    pytest.importorskip("tflite")
    from tests import tflite_writer as tw

    w = _weights(8)
    g = tw.Graph()
    x = g.add(tw.Tensor("x", (1, 4)))
    fc1 = g.add(tw.Tensor("fc1.weight", (6, 4), data=w["fc1.weight"].tobytes()))
    h = g.add(tw.Tensor("h", (1, 6)))
    fc2 = g.add(tw.Tensor("fc2.weight", (3, 6), data=w["fc2.weight"].tobytes()))
    y = g.add(tw.Tensor("y", (1, 3)))
    g.ops = [tw.Op(tw.FULLY_CONNECTED, [x, fc1, -1], [h]), tw.Op(tw.FULLY_CONNECTED, [h, fc2, -1], [y])]
    g.inputs, g.outputs = [x], [y]
    tw.write(folder / "model.tflite", g)
    return folder / "model.tflite", {k: torch.from_numpy(v) for k, v in w.items()}


WRITERS: dict[str, Writer] = {
    "safetensors": write_safetensors, "torch": write_torch, "gguf": write_gguf, "keras": write_keras,
    "onnx": write_onnx, "torchscript": write_torchscript, "npz": write_npz, "flax": write_flax,
    "tflite": write_tflite,
}


def read_all(ref: object) -> Expected:
    with open_source(ref) as source:
        return {e.name: to_torch(e.load()) for e in source.entries() if e.skip is None}


def test_every_format_has_a_writer() -> None:
    assert {f.name for f in file_formats()} <= set(WRITERS), "register a writer for the new format here"


@pytest.mark.parametrize("fmt", [f.name for f in file_formats()])
def test_each_format_reads_its_tiny_checkpoint(tmp_path: Path, fmt: str) -> None:
    path, expected = WRITERS[fmt](tmp_path)
    assert format_of(path).name == fmt
    for ref in (path, tmp_path):  # the file named alone, and the folder holding it
        got = read_all(ref)
        assert set(got) == set(expected), ref
        for name, tensor in expected.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), (ref, name)
    assert pick_weight_files([p.name for p in tmp_path.iterdir()]) == [path.name]


@pytest.mark.parametrize("fmt", [f.name for f in file_formats()])
def test_each_format_is_found_by_its_bytes_or_refuses_garbage(tmp_path: Path, fmt: str) -> None:
    """A sniffed format is recognised under a name no format claims; every format's reader gives a
    typed error (never a traceback) for garbage named like its files."""
    path, _ = WRITERS[fmt](tmp_path)
    spec = next(f for f in file_formats() if f.name == fmt)
    if spec.sniff is not None:
        renamed = path.rename(tmp_path / "weights.data")
        assert format_of(renamed).name == fmt
        renamed.rename(path)
    bad = tmp_path / ("garbage" + spec.suffixes[0])
    bad.write_bytes(b"\x00\x01not a checkpoint of any kind" * 3)
    with pytest.raises((CorruptCheckpointError, SourceNotFoundError)):
        read_all(bad)


def test_suffixes_and_locations_come_from_the_registries() -> None:
    assert CHECKPOINT_SUFFIXES[:11] == (".safetensors", ".bin", ".pt", ".pth", ".th", ".ckpt", ".gguf", ".h5",
                                        ".hdf5", ".keras", ".onnx")  # by rank: the folder preference
    assert set(CHECKPOINT_SUFFIXES[11:]) == {".jit", ".torchscript", ".npz", ".msgpack", ".tflite"}
    assert [loc.name for loc in locations()] == ["memory", "http", "object-store", "path", "timm", "torchvision", "hub"]
    assert [loc.name for loc in locations() if loc.streams] == ["http", "object-store", "hub"]


def test_an_unknown_format_name_suggests_the_close_one() -> None:
    from wbfe.errors import UnknownNameError
    from wbfe.sources.registry import format_named

    assert format_named("onnx").suffixes == (".onnx",)
    with pytest.raises(UnknownNameError, match=r"unknown checkpoint format 'onxx'.*onnx"):
        format_named("onxx")


def test_folder_preference_follows_the_ranks() -> None:
    assert pick_weight_files(["a.onnx", "model.safetensors", "b.bin"]) == ["model.safetensors"]
    assert pick_weight_files(["b.bin", "a.onnx"]) == ["b.bin"]
    assert pick_weight_files(["x-00002-of-00002.gguf", "x-00001-of-00002.gguf"]) == ["x-00001-of-00002.gguf"]
    assert pick_weight_files(["a.safetensors.index.json", "a-1.safetensors", "a-2.safetensors"]) == [
        "a.safetensors.index.json"]
    with pytest.raises(CorruptCheckpointError, match=r"^several weight files \(a.gguf, b.onnx\); pass one"):
        pick_weight_files(["a.gguf", "b.onnx"])
    with pytest.raises(CorruptCheckpointError, match=r"^several torch weight files and no single index"):
        pick_weight_files(["a.bin", "b.pt"])
    assert pick_weight_files(["README.md", "tokenizer.json"]) == []
    assert pick_weight_files(["flax_model.msgpack", "tf_model.h5"]) == ["tf_model.h5"]  # Keras ranks first
    assert pick_weight_files(["flax_model.msgpack", "opt.msgpack", "w.npz"]) == ["flax_model.msgpack"]


def test_a_single_file_beside_an_index_is_read_as_transformers_loads_it(tmp_path: Path) -> None:
    """``model.safetensors`` beside ``model.safetensors.index.json`` (a re-save that left the other behind):
    transformers loads the single file and never reads the index, so wbfe scores the single file too. Before
    the fix the index's shards were scored, a model transformers would not load."""
    transformers = pytest.importorskip("transformers")
    assert pick_weight_files(["model.safetensors.index.json", "model-00001-of-00002.safetensors",
                              "model-00002-of-00002.safetensors", "model.safetensors"]) == ["model.safetensors"]
    assert pick_weight_files(["pytorch_model.bin.index.json", "pytorch_model.bin"]) == ["pytorch_model.bin"]
    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=40, n_positions=8)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "sharded", max_shard_size="8KB")
    torch.manual_seed(1)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "single")
    folder = tmp_path / "both"
    folder.mkdir()
    for path in [*(tmp_path / "sharded").iterdir(), *(tmp_path / "single").iterdir()]:
        (folder / path.name).write_bytes(path.read_bytes())
    assert (folder / "model.safetensors.index.json").is_file() and (folder / "model.safetensors").is_file()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(folder).state_dict()
    got = read_all(folder)
    assert torch.equal(got["transformer.h.0.attn.c_attn.weight"], loaded["transformer.h.0.attn.c_attn.weight"])
    with open_source(folder) as source:
        assert source.provenance.format == "safetensors" and source.provenance.files == [str(folder / "model.safetensors")]


def test_a_broken_single_file_beside_an_index_is_said_not_passed_over(tmp_path: Path) -> None:
    """A dangling ``model.safetensors`` link beside the index: transformers fails on it; the folder's listing left it
    out, and the index's shards were scored without a word."""
    from safetensors.torch import save_file

    from wbfe.errors import SourceNotFoundError

    save_file({"a.weight": torch.ones(4, 4)}, str(tmp_path / "model-00001-of-00001.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a.weight": "model-00001-of-00001.safetensors"}}')
    (tmp_path / "model.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(SourceNotFoundError, match=r"model.safetensors: a symbolic link to .*gone.safetensors, which "
                                                  r"does not exist$"):
        open_source(tmp_path)


def test_one_shard_of_several_without_its_index_is_no_checkpoint() -> None:
    """A lone ``-0000k-of-0000n`` shard (n > 1) of a format with shard indexes is part of a checkpoint; one of one is
    a whole one, and a GGUF split set is read from its first split as before."""
    for lone in ("model-00002-of-00003.safetensors", "pytorch_model-00001-of-00002.bin"):
        with pytest.raises(CorruptCheckpointError, match=rf"^{lone} is shard \d of \d and no shard index is beside it"):
            pick_weight_files([lone, "config.json"])
    assert pick_weight_files(["model-00001-of-00001.safetensors"]) == ["model-00001-of-00001.safetensors"]
    assert pick_weight_files(["x-00001-of-00002.gguf", "x-00002-of-00002.gguf"]) == ["x-00001-of-00002.gguf"]


def test_a_fifo_named_like_any_format_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    for fmt in file_formats():
        fifo = tmp_path / f"pipe{fmt.suffixes[0]}"
        os.mkfifo(fifo)
        with pytest.raises(CorruptCheckpointError, match="not a regular file"):
            open_source(fifo)


def test_importing_the_sources_imports_no_reader_dependency() -> None:
    code = ("import sys, wbfe.sources\n"
            "print(sorted(m for m in ('torch', 'onnx', 'gguf', 'h5py', 'fsspec', 'huggingface_hub', 'msgpack', 'tflite')"
            " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_a_shard_index_is_an_index_whatever_its_bytes(tmp_path: Path) -> None:
    # Found by fuzzing: an index starting with b"GGUF" was read as an (empty) GGUF file, and the
    # folder's shards were dropped unseen; it is a corrupt index.
    index = tmp_path / "model.safetensors.index.json"
    index.write_bytes(b"GGUF" + b"\x00" * 40)
    assert format_of(index).name == "safetensors"
    with pytest.raises(CorruptCheckpointError, match="shard index"):
        read_all(tmp_path)
