"""Flax msgpack checkpoints (wbfe/sources/flax_files.py), written here with msgpack itself as
flax/serialization.py writes them (arrays as extension type 1 holding a packed (shape, dtype name,
C-order bytes); arrays over the chunk limit as chunked maps), read back in PyTorch's layout and
names and compared with the arrays they were written from; a BERT classifier in Flax's layout (and
as .npz) beside its config.json takes its head from the config, as its safetensors save does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import wbfe
from wbfe.errors import CorruptCheckpointError, TruncatedCheckpointError
from wbfe.linalg.arrays import to_torch
from wbfe.sources import open_source

msgpack = pytest.importorskip("msgpack")
RNG = np.random.default_rng(7)


def ext(array: np.ndarray, dtype_name: str | None = None, code: int = 1) -> Any:
    """flax.serialization._msgpack_ext_pack of one array."""
    payload = msgpack.packb((array.shape, dtype_name or array.dtype.name, array.tobytes("C")), use_bin_type=True)
    return msgpack.ExtType(code, payload)


def chunked(array: np.ndarray, pieces: int) -> dict:
    """flax.serialization._chunk with a small chunk size: the flat array in ``pieces`` parts."""
    flat = array.reshape(-1)
    parts = np.array_split(flat, pieces)
    return {"__msgpack_chunked_array__": True, "shape": {str(i): s for i, s in enumerate(array.shape)},
            "chunks": {str(i): ext(p) for i, p in enumerate(parts)}}


def write(path: Path, tree: dict) -> Path:
    def encode(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: encode(v) for k, v in node.items()}
        return ext(node) if isinstance(node, np.ndarray) else node

    path.write_bytes(msgpack.packb(encode(tree)))
    return path


DENSE = RNG.standard_normal((12, 8)).astype(np.float32)  # in × out
CONV = RNG.standard_normal((3, 3, 4, 12)).astype(np.float32)  # kh × kw × in × out
CONV1D = RNG.standard_normal((5, 4, 6)).astype(np.float32)  # k × in × out
EMBED = RNG.standard_normal((30, 12)).astype(np.float32)
SCALE = RNG.standard_normal(12).astype(np.float32)
HEAD = RNG.standard_normal((8, 5)).astype(np.float32)
MEAN = RNG.standard_normal(12).astype(np.float32)


def tree() -> dict:
    return {"params": {"embed": {"embedding": EMBED}, "conv": {"kernel": CONV, "bias": np.zeros(12, np.float32)},
                       "conv1d": {"kernel": CONV1D}, "norm": {"scale": SCALE},
                       "layer": {"0": {"dense": {"kernel": DENSE}}}, "classifier": {"kernel": HEAD}},
            "batch_stats": {"norm": {"mean": MEAN, "var": np.abs(MEAN)}}, "step": 100}


def read(path: Path) -> dict[str, Any]:
    with open_source(path) as source:
        return {e.name: e for e in source.entries()}


def test_read_in_pytorch_layout_and_names(tmp_path: Path) -> None:
    entries = read(write(tmp_path / "flax_model.msgpack", tree()))
    want = {
        "embed.weight": EMBED, "conv.weight": CONV.transpose(3, 2, 0, 1), "conv.bias": np.zeros(12, np.float32),
        "conv1d.weight": CONV1D.transpose(2, 1, 0), "norm.weight": SCALE, "layer.0.dense.weight": DENSE.T,
        "classifier.weight": HEAD.T, "norm.running_mean": MEAN, "norm.running_var": np.abs(MEAN),
    }
    assert list(entries) == list(want)  # stored order; the step count is no tensor
    for name, array in want.items():
        assert entries[name].shape == array.shape, name
        assert torch.equal(to_torch(entries[name].load()), torch.from_numpy(np.ascontiguousarray(array))), name


def test_chunked_bfloat16_and_scalars(tmp_path: Path) -> None:
    big = RNG.standard_normal((6, 10)).astype(np.float32)
    bf16 = torch.randn(4, 3, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    raw = {"big": {"kernel": chunked(big, 4)},
           "half": {"kernel": ext(bf16.view(torch.int16).numpy(), "bfloat16")},
           "count": msgpack.ExtType(3, msgpack.packb(((), "int32", np.int32(5).tobytes()), use_bin_type=True))}
    path = tmp_path / "flax_model.msgpack"
    path.write_bytes(msgpack.packb(raw))
    entries = read(path)
    assert torch.equal(to_torch(entries["big.weight"].load()), torch.from_numpy(big.T.copy()))
    assert entries["half.weight"].dtype == "bfloat16" and torch.equal(to_torch(entries["half.weight"].load()), bf16.T)
    assert entries["count"].skip == "a numpy scalar, not an array"


def test_byte_order_and_a_chunk_marker_as_flax_restores_them(tmp_path: Path) -> None:
    # Found by fuzzing (tests/fuzz_corpus/flax): a big-endian dtype read as native, and a chunked
    # array whose marker is not true read as arrays of its chunks.
    big_endian = DENSE.astype(">f4")
    raw = {"params": {"be": {"kernel": ext(big_endian, ">f4")},
                      "odd": {"bias": {"__msgpack_chunked_array__": False, "shape": {"0": 12},
                                       "chunks": {"0": ext(MEAN[:6]), "1": ext(MEAN[6:])}}}}}
    path = tmp_path / "flax_model.msgpack"
    path.write_bytes(msgpack.packb(raw))
    entries = read(path)
    assert list(entries) == ["be.weight", "odd.bias"]
    assert torch.equal(to_torch(entries["be.weight"].load()), torch.from_numpy(DENSE.T.copy()))
    assert torch.equal(to_torch(entries["odd.bias"].load()), torch.from_numpy(MEAN))


def test_folder_with_config_scores_like_the_pytorch_layout(tmp_path: Path) -> None:
    write(tmp_path / "flax_model.msgpack", tree())
    (tmp_path / "config.json").write_text(json.dumps({"num_labels": 5, "model_type": "toy"}))
    with open_source(tmp_path) as source:
        assert source.config == {"num_labels": 5, "model_type": "toy"}
        assert source.provenance.format == "flax-msgpack"
    got = {row["name"]: row["bfe"] for row in wbfe.score(tmp_path, metrics="bfe").layers}
    torch_state = {"embed.weight": EMBED, "conv.weight": CONV.transpose(3, 2, 0, 1),
                   "conv1d.weight": CONV1D.transpose(2, 1, 0),
                   "layer.0.dense.weight": DENSE.T, "classifier.weight": HEAD.T}
    want = {row["name"]: row["bfe"] for row in wbfe.score(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in torch_state.items()}, metrics="bfe").layers}
    assert got == want


@pytest.mark.parametrize("damage", ["truncated", "garbage", "short-array", "not-a-map"])
def test_damaged_files_get_a_typed_error(tmp_path: Path, damage: str) -> None:
    path = write(tmp_path / "flax_model.msgpack", tree())
    raw = path.read_bytes()
    expected: type[Exception] = CorruptCheckpointError
    if damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
        expected = TruncatedCheckpointError
    elif damage == "garbage":
        path.write_bytes(b"\xc1" + bytes(range(200)))
    elif damage == "short-array":
        payload = msgpack.packb(((4, 4), "float32", b"\0" * 60), use_bin_type=True)
        path.write_bytes(msgpack.packb({"fc": {"kernel": msgpack.ExtType(1, payload)}}))
    else:
        path.write_bytes(msgpack.packb([1, 2, 3]))
    with pytest.raises(expected, match=str(path)):
        read(path)


def flax_tree(state: dict[str, np.ndarray]) -> dict:
    """A PyTorch BERT state dict in Flax's layout, as transformers' PyTorch-to-Flax conversion
    writes it: nested maps, a Linear's ``kernel`` in × out, ``embedding`` and LayerNorm ``scale``."""
    out: dict = {}
    for name, array in state.items():
        *path, leaf = name.split(".")
        if leaf == "weight":
            if "LayerNorm" in path[-1]:
                leaf = "scale"
            elif path[-1].endswith("embeddings"):
                leaf = "embedding"
            else:
                leaf, array = "kernel", np.ascontiguousarray(array.T)
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = array
    return out


def test_a_bert_classifier_as_msgpack_and_npz_takes_its_head_from_config_json(tmp_path: Path) -> None:
    """The same tiny BertForSequenceClassification saved by transformers as safetensors, written as
    flax_model.msgpack (Flax's layout) and as model.npz, each beside its config.json: the same
    matrices in the same orientation, the head the config's architecture names, decided by it."""
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import load_file

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=24, num_labels=3)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "st")
    state = load_file(str(tmp_path / "st" / "model.safetensors"))
    config_json = (tmp_path / "st" / "config.json").read_text()
    (tmp_path / "flax").mkdir()
    write(tmp_path / "flax" / "flax_model.msgpack", flax_tree(state))
    (tmp_path / "npz").mkdir()
    np.savez(tmp_path / "npz" / "model.npz", **state)
    reference = wbfe.describe(str(tmp_path / "st"))
    want = wbfe.score(str(tmp_path / "st"), metrics="bfe")
    assert reference.head == "classifier.weight" and want.summary["head_source"] == "framework"
    assert want.model["framework"] == {"used": "transformers", "model": "BertForSequenceClassification",
                                       "dropout_read": "forward pass on the meta device"}
    for folder, fmt in (("flax", "flax-msgpack"), ("npz", "npz")):
        bare = wbfe.describe(str(tmp_path / folder))
        (tmp_path / folder / "config.json").write_text(config_json)
        got = wbfe.describe(str(tmp_path / folder))
        assert got.model["format"] == fmt
        # describe plans by the config's rules where they decide (no transformers import), as for
        # the safetensors original; the score builds transformers' description
        assert got.head == reference.head and got.head_source == reference.head_source != bare.head_source
        assert got.model["framework"] == reference.model["framework"]
        # Orientation: every matrix out × in, as the PyTorch checkpoint holds it.
        assert [(m["name"], m["shape"], m["N"], m["M"], m["role"]) for m in got.matrices] == \
            [(m["name"], m["shape"], m["N"], m["M"], m["role"]) for m in reference.matrices]
        scored = wbfe.score(str(tmp_path / folder), metrics="bfe")
        assert scored.layers == want.layers and scored.summary == want.summary
        assert scored.model["framework"] == want.model["framework"]


def test_arrays_inside_a_list_are_read_named_by_their_index(tmp_path: Path) -> None:
    """msgpack_serialize of a pytree with a list (a tuple of layers): the list's arrays were dropped unread, and a
    file holding only such arrays was refused as one with no arrays."""
    layers = [{"kernel": ext(DENSE)}, {"kernel": ext(HEAD)}]
    for name, tree_ in (("mixed", {"params": {"embed": {"embedding": ext(EMBED)}, "layers": layers}}),
                        ("only", {"params": {"layers": layers}})):
        path = tmp_path / f"{name}.msgpack"
        path.write_bytes(msgpack.packb(tree_))
        with open_source(path) as source:
            read = {e.name: np.asarray(to_torch(e.load())) for e in source.entries()}
        assert np.array_equal(read["layers.0.weight"], DENSE.T) and np.array_equal(read["layers.1.weight"], HEAD.T)
        assert set(read) == {"layers.0.weight", "layers.1.weight"} | ({"embed.weight"} if name == "mixed" else set())


def test_scan_stacked_layers_are_each_layers_own_matrices(tmp_path: Path) -> None:
    """nn.scan(..., variable_axes={'params': 0}) stores every parameter of the scanned block with a leading layer
    axis: a Dense kernel (L, in, out), its bias (L, out), a LayerNorm scale (L, d). wbfe scored the stacked kernel
    as one 1-D convolution of width L (out × in × L); layer i's kernel is kernel[i], as the scan applies it, so each
    is listed as ``layers.i...`` (out × in). A Conv1D kernel (k, in, out) beside a 1-D bias stays one convolution."""
    layers, d, hidden = 3, 8, 12
    up = RNG.standard_normal((layers, d, hidden)).astype(np.float32)
    down = RNG.standard_normal((layers, hidden, d)).astype(np.float32)
    block = {"mlp_up": {"kernel": up, "bias": np.zeros((layers, hidden), np.float32)},
             "mlp_down": {"kernel": down},  # use_bias=False: stacked all the same
             "norm": {"scale": np.ones((layers, d), np.float32), "bias": np.zeros((layers, d), np.float32)}}
    params = {"conv": {"kernel": CONV1D, "bias": np.zeros(6, np.float32)}, "layers": block}
    with open_source(write(tmp_path / "flax_model.msgpack", {"params": params})) as source:
        entries = {e.name: e for e in source.entries()}
    assert entries["conv.weight"].shape == (6, 4, 5)
    assert np.array_equal(to_torch(entries["conv.weight"].load()).numpy(), CONV1D.transpose(2, 1, 0))
    for i in range(layers):
        for name, stacked in (("mlp_up", up), ("mlp_down", down)):
            entry = entries[f"layers.{i}.{name}.weight"]
            assert entry.skip is None and entry.shape == stacked.shape[:0:-1]
            assert np.array_equal(to_torch(entry.load()).numpy(), stacked[i].T)
        assert entries[f"layers.{i}.norm.weight"].shape == (d,)
    assert not any(name.startswith("layers.mlp") for name in entries)


def test_attention_projections_are_read_as_the_matrices_they_apply(tmp_path: Path) -> None:
    """flax's MultiHeadDotProductAttention keeps DenseGeneral kernels: query/key/value (d, heads, head_dim) and out
    (heads, head_dim, d). wbfe read each 3-D kernel as a 1-D convolution (out = head_dim, in = heads, width d):
    a matrix the layer never applies. Each is now the matrix of its einsum, checked by applying it to a vector:
    query's (heads·head_dim) × d as einsum('d,dhk->hk'), out's d × (heads·head_dim) as einsum('hk,hkd->d')."""
    d, heads, head_dim = 16, 4, 8
    proj = {n: RNG.standard_normal((d, heads, head_dim)).astype(np.float32) for n in ("query", "key", "value")}
    out = RNG.standard_normal((heads, head_dim, d)).astype(np.float32)
    attention = {n: {"kernel": k, "bias": np.zeros((heads, head_dim), np.float32)} for n, k in proj.items()}
    attention["out"] = {"kernel": out, "bias": np.zeros(d, np.float32)}
    params = {"block": {"attn": attention}, "conv": {"kernel": CONV1D, "bias": np.zeros(6, np.float32)}}
    with open_source(write(tmp_path / "flax_model.msgpack", {"params": params})) as source:
        entries = {e.name: e for e in source.entries()}
    x, h = RNG.standard_normal(d).astype(np.float64), RNG.standard_normal((heads, head_dim)).astype(np.float64)
    for name, kernel in proj.items():
        entry = entries[f"block.attn.{name}.weight"]
        assert entry.shape == (heads * head_dim, d)
        got = to_torch(entry.load()).numpy().astype(np.float64) @ x
        assert np.allclose(got, np.einsum("d,dhk->hk", x, kernel).reshape(-1), rtol=1e-6)
    entry = entries["block.attn.out.weight"]
    assert entry.shape == (d, heads * head_dim)
    got = to_torch(entry.load()).numpy().astype(np.float64) @ h.reshape(-1)
    assert np.allclose(got, np.einsum("hk,hkd->d", h, out), rtol=1e-6)
    assert entries["conv.weight"].shape == (6, 4, 5)  # a convolution elsewhere stays one
