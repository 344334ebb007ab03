"""GGUF files written by the ``gguf`` package's own writer score like the PyTorch original: exactly
for F32, and within the bound the measured quantisation error allows for quantised types."""

from __future__ import annotations

import hashlib
import math
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import wbfe
from tests.kquants import K_QUANTIZERS
from wbfe.errors import CorruptCheckpointError, MissingDependencyError, SourceNotFoundError, TruncatedCheckpointError
from wbfe.sources import open_source
from wbfe_cli.main import app

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType


def llama_state_dict(seed: int = 0, tied: bool = False) -> dict[str, torch.Tensor]:
    """A one-block llama-shaped model under llama.cpp's tensor names, weights out × in as PyTorch holds them."""
    g = torch.Generator().manual_seed(seed)
    dim, hidden, vocab = 256, 512, 512

    def w(out: int, inp: int) -> torch.Tensor:
        # Random singular vectors, singular values from 0.5 to 3 with a few large ones (as trained
        # matrices have), none near zero so that the quantisation bound below stays informative.
        k = min(out, inp)
        u = torch.linalg.qr(torch.randn(out, k, generator=g)).Q
        v = torch.linalg.qr(torch.randn(inp, k, generator=g)).Q
        s = 0.5 + 2.5 * torch.rand(k, generator=g) ** 8
        return ((u * s) @ v.T / math.sqrt(k)).contiguous()

    state = {"token_embd.weight": w(vocab, dim)}
    for i in range(1):
        state.update({
            f"blk.{i}.attn_norm.weight": 1.0 + 0.1 * torch.randn(dim, generator=g),
            f"blk.{i}.attn_q.weight": w(dim, dim),
            f"blk.{i}.attn_k.weight": w(dim, dim),
            f"blk.{i}.attn_v.weight": w(dim, dim),
            f"blk.{i}.attn_output.weight": w(dim, dim),
            f"blk.{i}.ffn_norm.weight": 1.0 + 0.1 * torch.randn(dim, generator=g),
            f"blk.{i}.ffn_gate.weight": w(hidden, dim),
            f"blk.{i}.ffn_up.weight": w(hidden, dim),
            f"blk.{i}.ffn_down.weight": w(dim, hidden),
        })
    state["output_norm.weight"] = torch.ones(dim)
    if not tied:
        state["output.weight"] = w(vocab, dim)
    return state


def encode(array: np.ndarray, kind: str) -> np.ndarray:
    """Float (out, in) -> what GGUFWriter.add_tensor takes for ``kind``."""
    if kind == "F32":
        return array.astype(np.float32)
    if kind == "F16":
        return array.astype(np.float16)
    if kind in K_QUANTIZERS:
        return K_QUANTIZERS[kind](array)
    return gguf.quants.quantize(array.astype(np.float32), T[kind])


def write_gguf(path: Path, state: dict[str, torch.Tensor], kind: str = "F32", **writer_args: object) -> Path:
    """``state`` through gguf.GGUFWriter: 2-D tensors as ``kind``, 1-D ones as F32 (as llama.cpp does)."""
    writer = gguf.GGUFWriter(str(path), arch="llama", **writer_args)
    writer.add_name("tiny-llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if kind == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    for name, tensor in state.items():
        array = tensor.numpy()
        if array.ndim == 1:
            writer.add_tensor(name, array.astype(np.float32))
        else:
            data = encode(array, kind)
            writer.add_tensor(name, data, raw_dtype=None if kind in ("F32", "F16") else T[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reference_dequantised(path: Path) -> dict[str, torch.Tensor]:
    """The file read independently: gguf.GGUFReader's own views, dequantised, as out × in floats."""
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        floats = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        out[t.name] = torch.from_numpy(floats.reshape(tuple(reversed(t.shape.tolist()))))
    return out


def bfe_bound(original: torch.Tensor, other: torch.Tensor) -> float:
    """A bound on |BFE-W*(W) − BFE-W*(W')| from the measured error W − W' alone.

    BFE-W* = ½·log(2πe) + log rms(s) − mean(log s) over the n singular values s. Weyl:
    |s_i − s'_i| ≤ ‖W − W'‖₂ =: δ, so |mean log s − mean log s'| ≤ δ / (s_min − δ); and
    |rms(s) − rms(s')| ≤ ‖W − W'‖_F / √n =: ε, so |log rms − log rms'| ≤ ε / (rms − ε).
    """
    w, d = original.double(), (original.double() - other.double())
    s = torch.linalg.svdvals(w)
    delta = float(torch.linalg.matrix_norm(d, ord=2))
    eps = float(torch.linalg.matrix_norm(d)) / math.sqrt(s.numel())
    rms = float(s.square().mean().sqrt())
    assert delta < float(s.min()) and eps < rms, "quantisation error too large for the bound"
    return delta / (float(s.min()) - delta) + eps / (rms - eps)


def by_name(result: wbfe.ModelScore) -> dict[str, dict]:
    return {layer["name"]: layer for layer in result.layers}


@pytest.fixture(scope="module")
def model() -> dict[str, torch.Tensor]:
    return llama_state_dict()


@pytest.fixture(scope="module")
def original(model: dict) -> dict[str, dict]:
    """The PyTorch original's rows."""
    return by_name(wbfe.score(model, metrics="bfe"))


def test_f32_scores_exactly_as_the_pytorch_original(tmp_path: Path, model: dict, original: dict) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", model, "F32")
    got = wbfe.score(path, metrics="bfe")
    assert set(by_name(got)) == set(original) == {n for n, t in model.items() if t.ndim == 2}
    for name, row in by_name(got).items():
        assert row["bfe"] == original[name]["bfe"], name
        assert row["shape"] == list(model[name].shape)  # out × in, GGUF's reversed dims undone
        assert row["quant"] is None and row["dtype"] == "float32"
    roles = {row["name"]: row["role"] for row in got.layers}
    assert roles["token_embd.weight"] == "embedding" and roles["output.weight"] == "head"
    assert roles["blk.0.attn_q.weight"] == "attention" and roles["blk.0.ffn_down.weight"] == "mlp"
    assert got.summary["head"] == "output.weight" and got.summary["head_source"] == "framework"
    assert {s["name"] for s in got.skipped} == {n for n, t in model.items() if t.ndim == 1}
    assert got.model["format"] == "gguf"
    assert got.model["metadata"]["general.architecture"] == "llama"
    assert got.model["metadata"]["general.name"] == "tiny-llama"
    assert got.model["metadata"]["general.file_type"] == "ALL_F32"
    assert got.model["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"])
def test_quantised_scores_within_the_quantisation_error(tmp_path: Path, model: dict, original: dict, kind: str) -> None:
    path = write_gguf(tmp_path / f"tiny-{kind}.gguf", model, kind)
    got = by_name(wbfe.score(path, metrics="bfe"))
    decoded = reference_dequantised(path)
    reference = by_name(wbfe.score({n: t for n, t in decoded.items() if n in got}, metrics="bfe"))
    quant = None if kind in ("F16", "BF16") else f"gguf-{kind.lower()}"
    for name, row in got.items():
        assert row["quant"] == quant, name
        assert row["shape"] == list(model[name].shape)
        # the same numbers as gguf's own reader and dequantiser give
        assert row["bfe"] == pytest.approx(reference[name]["bfe"], rel=1e-12, abs=1e-12), name
        error = abs(row["bfe"] - original[name]["bfe"])
        assert error <= bfe_bound(model[name], decoded[name]), (name, error)
        assert row["bfe"] != original[name]["bfe"]  # quantisation did change the matrix


def test_tied_head_is_the_token_embedding(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tied.gguf", llama_state_dict(tied=True), "Q8_0")
    result = wbfe.score(path, metrics="bfe")
    assert result.summary["head"] == "token_embd.weight"
    assert result.summary["head_source"] == "framework"
    assert result.summary["head_note"] == "no output.weight: the head is the token embedding, as llama.cpp reads it"
    assert result.model["framework"] == {"used": "gguf", "model": "llama",
                                         "note": "no output.weight: the head is the token embedding, as llama.cpp "
                                                 "reads it"}
    assert by_name(result)["token_embd.weight"]["role"] == "head"
    # Rows in the file's own (llama.cpp's) order, which the writer kept: the model's.
    stored = list(llama_state_dict(tied=True))
    rows = [r["name"] for r in result.layers]
    assert rows == [n for n in stored if n in set(rows)]


def test_split_files_read_as_one_model(tmp_path: Path, model: dict) -> None:
    whole = wbfe.score(write_gguf(tmp_path / "one.gguf", model, "Q8_0"), metrics="bfe")
    (tmp_path / "set").mkdir()
    write_gguf(tmp_path / "set" / "split.gguf", model, "Q8_0", split_max_tensors=5)
    files = sorted((tmp_path / "set").glob("split-*-of-*.gguf"))
    assert len(files) == 3
    for given in (files[0], files[2]):  # any split names the whole set
        got = wbfe.score(given, metrics="bfe")
        assert [(r["name"], r["bfe"]) for r in got.layers] == [(r["name"], r["bfe"]) for r in whole.layers]
        assert got.model["format"] == "gguf-split" and got.model["files"] == [str(f) for f in files]
        assert got.model["metadata"]["general.name"] == "tiny-llama"
    folder = wbfe.score(tmp_path / "set", metrics="bfe")  # the folder: its set, named by split 1
    assert [(r["name"], r["bfe"]) for r in folder.layers] == [(r["name"], r["bfe"]) for r in whole.layers]
    files[1].unlink()
    with pytest.raises(SourceNotFoundError, match=r"split 2 of 3 \(split-00002-of-00003.gguf\) is missing"):
        wbfe.score(files[0], metrics="bfe")


def test_a_tensor_stored_in_two_splits_is_refused(tmp_path: Path) -> None:
    """Each split is read by its own GGUFReader, which refuses a name twice in one file only: the set held two
    different 'w.aaaa' rows."""
    g = torch.Generator().manual_seed(0)
    write_gguf(tmp_path / "s.gguf", {"w.aaaa": torch.randn(64, 32, generator=g),
                                     "w.bbbb": torch.randn(64, 32, generator=g)}, "F32", split_max_tensors=1)
    first, second = sorted(tmp_path.glob("s-*-of-*.gguf"))
    second.write_bytes(second.read_bytes().replace(b"w.bbbb", b"w.aaaa"))
    with pytest.raises(CorruptCheckpointError, match=r"'w.aaaa' is stored twice, in s-00001-of-00002.gguf and s-00002"):
        wbfe.score(first, metrics="bfe")
    code, err = _cli(tmp_path)
    assert code == 2 and err.count("\n") == 1 and "stored twice" in err, err


def test_types_without_a_dequantiser_are_skipped_with_the_type_named(tmp_path: Path) -> None:
    state = llama_state_dict()
    writer = gguf.GGUFWriter(str(tmp_path / "mixed.gguf"), arch="llama")
    writer.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(state["blk.0.attn_q.weight"].numpy(), T.Q8_0),
                      raw_dtype=T.Q8_0)
    # Q8_1: a valid block size, but the package has no dequantiser for it
    writer.add_tensor("blk.0.attn_k.weight", np.zeros((256, 256 // 32 * 40), np.uint8), raw_dtype=T.Q8_1)
    writer.add_tensor("blk.0.counts", np.arange(64 * 32, dtype=np.int32).reshape(64, 32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file, writer.close):
        step()
    result = wbfe.score(tmp_path / "mixed.gguf", metrics="bfe")
    assert [r["name"] for r in result.layers] == ["blk.0.attn_q.weight"]
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    assert "gguf-q8_1" in reasons["blk.0.attn_k.weight"]
    assert "int32" in reasons["blk.0.counts"]


def test_picked_by_magic_bytes_and_from_a_folder(tmp_path: Path, model: dict) -> None:
    path = write_gguf(tmp_path / "m.gguf", model, "Q8_0")
    want = [(r["name"], r["bfe"]) for r in wbfe.score(path, metrics="bfe").layers]
    renamed = tmp_path / "weights.bin"  # a PyTorch suffix, GGUF bytes
    renamed.write_bytes(path.read_bytes())
    assert [(r["name"], r["bfe"]) for r in wbfe.score(renamed, metrics="bfe").layers] == want
    renamed.unlink()
    assert [(r["name"], r["bfe"]) for r in wbfe.score(tmp_path, metrics="bfe").layers] == want


# ---- bad input: a typed error from the library, exit 2 and one line from the CLI ----------------

def _cli(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["score", str(path), "--metrics", "bfe"])
    return result.exit_code, result.stderr


def _tensor_info_offsets(path: Path) -> dict[str, int]:
    """File offset of each tensor's stored data-offset field (the u64 after its type)."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: int(t.field.offset) + sum(int(p.nbytes) for p in t.field.parts[:-1]) for t in reader.tensors}


@pytest.mark.parametrize("damage", ["truncated-data", "truncated-header", "bad-magic", "offset-out-of-range", "empty",
                                    "data-shared", "data-overlapping"])
def test_bad_files_get_a_typed_error_and_exit_2(tmp_path: Path, damage: str) -> None:
    path = write_gguf(tmp_path / "m.gguf", llama_state_dict(), "F32")
    raw = bytearray(path.read_bytes())
    expected: type[Exception] = CorruptCheckpointError
    if damage == "truncated-data":
        raw = raw[: len(raw) - 5000]
        expected = TruncatedCheckpointError
    elif damage == "truncated-header":
        raw = raw[:300]
    elif damage == "bad-magic":
        raw[:4] = b"GGUX"
    elif damage == "empty":
        raw = bytearray()
        expected = TruncatedCheckpointError
    elif damage.startswith("data-"):  # attn_k's data at attn_q's, or inside it: scored, or skipped as tied
        reader = gguf.GGUFReader(str(path))
        start = {t.name: int(t.field.parts[-1][0]) for t in reader.tensors}["blk.0.attn_q.weight"]
        field = _tensor_info_offsets(path)["blk.0.attn_k.weight"]
        raw[field:field + 8] = struct.pack("<Q", start + (0 if damage == "data-shared" else 4096))
    else:
        field = _tensor_info_offsets(path)["blk.0.attn_q.weight"]
        raw[field:field + 8] = struct.pack("<Q", len(raw) * 4)
        expected = TruncatedCheckpointError
    path.write_bytes(bytes(raw))
    with pytest.raises(expected) as info:
        wbfe.score(path, metrics="bfe")
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    code, err = _cli(path)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_missing_gguf_package_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_gguf(tmp_path / "m.gguf", llama_state_dict(), "F32")
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'wbfe\[gguf\]'"):
        with open_source(path):
            pass
    code, err = _cli(path)
    assert code == 2 and "pip install 'wbfe[gguf]'" in err and "Traceback" not in err


@pytest.mark.parametrize("layout", ["gap", "unaligned", "out of order"])
def test_tensor_data_not_packed_in_header_order_is_refused_as_ggml_refuses_it(tmp_path: Path, layout: str) -> None:
    """ggml's gguf_init_from_file (which llama.cpp loads with) requires tensor i's data offset to be the sum of the
    earlier tensors' sizes, each padded to general.alignment ("tensor '%s' has offset %u, expected %zu"); gguf-py's
    GGUFReader takes any offset. wbfe read a file with a gap, an unaligned offset or two tensors' data swapped
    (all within the file) and scored bytes llama.cpp never reads as those weights; it now refuses it, as ggml does."""
    path = write_gguf(tmp_path / "m.gguf", llama_state_dict(), "F32")
    raw = bytearray(path.read_bytes())
    reader = gguf.GGUFReader(str(path))
    relative = {t.name: int(t.field.parts[-1][0]) for t in reader.tensors}
    fields = _tensor_info_offsets(path)
    last = reader.tensors[-1].name
    if layout == "out of order":  # attn_q and attn_k, of one size, swap places
        q, k = "blk.0.attn_q.weight", "blk.0.attn_k.weight"
        moved = {q: relative[k], k: relative[q]}
        expected = relative[q]
    else:
        moved = {last: relative[last] + (reader.alignment if layout == "gap" else 4)}
        raw += bytes(reader.alignment)  # in the file still
        expected = relative[last]
    for name, offset in moved.items():
        raw[fields[name]:fields[name] + 8] = struct.pack("<Q", offset)
    path.write_bytes(bytes(raw))
    assert len(gguf.GGUFReader(str(path)).tensors) == len(reader.tensors)  # gguf-py reads it
    first = next(t for t in reader.tensors if t.name in moved).name
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"tensor {first!r} has data offset {moved[first]}, expected {expected}")):
        wbfe.score(path, metrics="bfe")
