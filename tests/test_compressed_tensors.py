"""compressed-tensors checkpoints (llm-compressor's W4A16, W8A16, W8A8 and FP8 models, as vLLM loads them), written
by the package's own ModelCompressor over a small torch model in the real on-disk layout (safetensors and config.json
with its quantization_config). The reference is the package's own decompression: wbfe's dequantised matrix equals it
to float32 rounding (its scales are float32, so its products round once) and exactly where it is run in float64,
and a score of the quantised checkpoint gives the rows of a score of a float checkpoint holding those weights."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

import wbfe
from wbfe.quant.compressed import dequantize_compressed, unpack_values

pytest.importorskip("compressed_tensors")

# Column counts that no group, block or packing divides evenly where the layout allows it (80 inputs: 10 words of
# 4-bit values; 300 x 200 in 128 x 128 blocks).
_SHAPES = {"up": (96, 128), "odd": (40, 80), "head": (200, 128)}


def _model(shapes: dict[str, tuple[int, int]], seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Module()
    for name, (out, inp) in shapes.items():
        setattr(model, name, torch.nn.Linear(inp, out, bias=False))
    return model


def _calibrate(module: torch.nn.Module) -> None:
    """Min-max scales and zero points by the package's ``calculate_qparams``, per tensor, channel, group or block."""
    from compressed_tensors.quantization.utils import calculate_qparams, maybe_pad_tensor_for_block_quant

    args, w = module.quantization_scheme.weights, module.weight.detach()
    if args.strategy == "group":
        w = w.reshape(w.shape[0], -1, args.group_size)
        lo, hi = w.amin(-1), w.amax(-1)
    elif args.strategy == "block":
        b0, b1 = args.block_structure
        padded = maybe_pad_tensor_for_block_quant(w, (b0, b1))
        blocks = padded.reshape(padded.shape[0] // b0, b0, padded.shape[1] // b1, b1)
        lo, hi = blocks.amin((1, 3)), blocks.amax((1, 3))
    elif args.strategy == "channel":
        lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    else:
        lo, hi = w.amin().reshape(1), w.amax().reshape(1)
    scale, zero = calculate_qparams(lo, hi, args)
    module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))


def _checkpoint(tmp_path: Path, weights: dict[str, Any], acts: Optional[dict[str, Any]] = None,
                shapes: Optional[dict[str, tuple[int, int]]] = None) -> tuple[Path, dict[str, torch.Tensor], dict]:
    """A compressed checkpoint of a model whose ``head`` the config ignores, written as llm-compressor writes one; with
    the weights the package decompresses from it (in float64) and its state dict as stored."""
    from compressed_tensors.compressors import BaseCompressor, ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 apply_quantization_config)
    from safetensors.torch import save_file

    model = _model(shapes or _SHAPES)
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**weights),
                                input_activations=QuantizationArgs(**acts) if acts else None)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["head"]))
    quantised = [name for name, m in model.named_children() if hasattr(m, "quantization_scheme")]
    for name in quantised:
        _calibrate(getattr(model, name))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    folder = tmp_path / "ct"
    folder.mkdir()
    stored = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(stored, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    compressor.update_config(str(folder))
    reference = {f"{n}.weight": stored[f"{n}.weight"] for n, _ in model.named_children() if n not in quantised}
    for name in quantised:  # the package's own decompression, its scale in float64: no rounding
        module = getattr(model, name)
        parts = {k.removeprefix(f"{name}."): v for k, v in stored.items() if k.startswith(f"{name}.")}
        parts["weight_scale"] = parts["weight_scale"].double()
        codec = BaseCompressor.get_value_from_registry(module.quantization_scheme.format.value)
        reference[f"{name}.weight"] = codec.decompress(parts, module.quantization_scheme)["weight"]
    compressor.decompress_model(model)  # the package's decompression as it runs, in the scale's float32
    stock = {f"{n}.weight": getattr(model, n).weight.detach() for n in quantised}
    return folder, reference, stock


def _loaded(folder: Path) -> dict[str, tuple[str, torch.Tensor]]:
    """Every weight wbfe plans from ``folder``, dequantised: name -> (quant, float64 matrix)."""
    from wbfe.linalg.arrays import to_torch
    from wbfe.quant import dequantised
    from wbfe.sources import open_source

    with open_source(folder) as source:
        return {e.name: (e.quant, to_torch(e.load())) for e, why in dequantised(source.entries(), source.config)
                if why is None}


def _same_rows(tmp_path: Path, folder: Path, reference: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Score the quantised checkpoint and a float64 one holding ``reference``: the same rows but for ``quant``."""
    from safetensors.torch import save_file

    plain = tmp_path / "float"
    plain.mkdir()
    save_file({k: v.contiguous() for k, v in reference.items()}, str(plain / "model.safetensors"))
    (plain / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    rows = wbfe.score(folder, metrics="bfe").layers
    expected = wbfe.score(plain, metrics="bfe").layers
    assert [{k: v for k, v in r.items() if k != "quant"} for r in rows] == [
        {k: v for k, v in r.items() if k != "quant"} for r in expected]
    return rows


@pytest.mark.parametrize("weights,quant", [
    ({"num_bits": 4, "strategy": "group", "group_size": 16, "symmetric": True}, "int4-g16"),
    ({"num_bits": 4, "strategy": "group", "group_size": 16, "symmetric": False}, "int4-g16"),
    ({"num_bits": 4, "strategy": "channel", "symmetric": False}, "int4-channel"),
    ({"num_bits": 8, "strategy": "channel", "symmetric": True}, "int8-channel"),
    ({"num_bits": 8, "strategy": "group", "group_size": 16, "symmetric": False}, "int8-g16"),
    ({"num_bits": 2, "strategy": "tensor", "symmetric": True}, "int2-tensor"),
    ({"num_bits": 4, "strategy": "block", "block_structure": [32, 64], "symmetric": False}, "int4-block32x64"),
])
def test_pack_quantized_equals_the_packages_decompression(tmp_path: Path, weights: dict, quant: str) -> None:
    """W4A16 / W8A16 (llm-compressor's pack-quantized): int32 words holding 32/b values, ``weight_shape``, an
    asymmetric scheme's zero points packed down the columns. These weights were skipped; now they are scored."""
    folder, reference, stock = _checkpoint(tmp_path, weights)
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized"
    loaded = _loaded(folder)
    for name in ("up.weight", "odd.weight"):
        scheme, matrix = loaded[name]
        assert scheme == f"compressed-tensors-{quant}" and matrix.dtype == torch.float64
        assert torch.equal(matrix, reference[name])  # exact: the package run in float64
        assert torch.equal(matrix.float(), stock[name])  # the package as it runs: one float32 rounding of ours
    rows = _same_rows(tmp_path, folder, reference)
    assert [r["name"] for r in rows] == ["head.weight", "odd.weight", "up.weight"]
    result = wbfe.score(folder, metrics="bfe")
    assert {s["name"]: s["reason"] for s in result.skipped if s["name"].startswith("odd.")} == {
        f"odd.{part}": f"consumed: {what} of odd.weight" for part, what in (
            ("weight_scale", "scale"), ("weight_shape", "shape"),
            ("weight_packed", "packed data"), *([("weight_zero_point", "zero points")] if not weights["symmetric"]
                                                else []))} | {
        "odd.weight_packed": "consumed: packed data of odd.weight (scored dequantised)"}


@pytest.mark.parametrize("weights,quant", [
    ({"num_bits": 8, "strategy": "channel", "symmetric": True}, "int8-channel"),
    ({"num_bits": 8, "strategy": "channel", "symmetric": False}, "int8-channel"),
    ({"num_bits": 8, "strategy": "group", "group_size": 16, "symmetric": True}, "int8-g16"),
    ({"num_bits": 8, "strategy": "tensor", "symmetric": True}, "int8-tensor"),
    ({"num_bits": 8, "strategy": "block", "block_structure": [64, 64], "symmetric": True}, "int8-block64"),
])
def test_int_quantized_equals_the_packages_decompression(tmp_path: Path, weights: dict, quant: str) -> None:
    """W8A8 (int-quantized): an int8 ``weight`` beside its scale (and zero point), activations quantised per token."""
    acts = {"num_bits": 8, "strategy": "token", "dynamic": True, "symmetric": True}
    folder, reference, stock = _checkpoint(tmp_path, weights, acts)
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["format"] == "int-quantized"
    loaded = _loaded(folder)
    for name in ("up.weight", "odd.weight"):
        assert loaded[name][0] == f"compressed-tensors-{quant}"
        assert torch.equal(loaded[name][1], reference[name])
        assert torch.equal(loaded[name][1].float(), stock[name])
    _same_rows(tmp_path, folder, reference)


@pytest.mark.parametrize("weights,quant", [
    ({"strategy": "channel"}, "fp8-e4m3-channel"),
    ({"strategy": "channel", "symmetric": False}, "fp8-e4m3-channel"),
    ({"strategy": "tensor"}, "fp8-e4m3-tensor"),
    ({"strategy": "block", "block_structure": [128, 128]}, "fp8-e4m3-block128"),
])
def test_float_quantized_equals_the_packages_decompression(tmp_path: Path, weights: dict, quant: str) -> None:
    """FP8 (float-quantized) goes by wbfe's FP8 path, an asymmetric scheme's FP8 zero point subtracted (it was ignored).
    A 200 x 300 weight in 128 x 128 blocks has a 2 x 3 scale grid,
    which alone reads as blocks of 100 x 100: the block is the config's ``block_structure`` (the grid's block gave a
    different matrix)."""
    fp8 = {"num_bits": 8, "type": "float", "symmetric": True}
    shapes = {"up": (200, 300), "odd": (40, 80), "head": (200, 128)}
    folder, reference, stock = _checkpoint(tmp_path, fp8 | weights, fp8 | {"strategy": "token", "dynamic": True},
                                           shapes)
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["format"] == "float-quantized"
    loaded = _loaded(folder)
    names = ["up.weight"] if weights["strategy"] == "block" else ["up.weight", "odd.weight"]  # 40 x 80: no block
    for name in names:
        assert loaded[name][0] == quant
        assert torch.equal(loaded[name][1], reference[name])
        assert torch.equal(loaded[name][1].float(), stock[name])


def test_an_activation_ordered_group_index_is_skipped_and_one_in_input_order_is_not(tmp_path: Path) -> None:
    """Older llm-compressor releases wrote ``weight_g_idx`` (actorder="group"); compressed-tensors 0.20 has no such
    scheme and decompresses as if groups were contiguous. A g_idx in input order changes nothing; a permuted one is
    a weight no decompression of the package gives: skipped saying so, and marked quantised for the edits."""
    from safetensors.torch import load_file, save_file

    folder, reference, _ = _checkpoint(tmp_path, {"num_bits": 4, "strategy": "group", "group_size": 16})
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["up.weight_g_idx"] = torch.arange(128, dtype=torch.int32) // 16
    tensors["odd.weight_g_idx"] = (torch.arange(80, dtype=torch.int32) // 16)[torch.randperm(
        80, generator=torch.Generator().manual_seed(0))]
    save_file(tensors, str(folder / "model.safetensors"))
    result = wbfe.score(folder, metrics="bfe")
    rows = {r["name"]: r for r in result.layers}
    assert sorted(rows) == ["head.weight", "up.weight"]
    assert torch.equal(_loaded(folder)["up.weight"][1], reference["up.weight"])
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    assert reasons["up.weight_g_idx"] == "consumed: group index of up.weight"
    assert reasons["odd.weight_scale"] == (
        "scale of odd.weight, stored as an activation-ordered weight_g_idx (inputs out of group order), which "
        "compressed-tensors' own decompression no longer applies: not scored")


def test_fp4_packed_values_are_skipped_naming_the_format() -> None:
    """nvfp4-pack-quantized: two FP4 values a uint8 byte, an FP8 scale per 16 and a global scale. wbfe does not
    dequantise it; every part is skipped saying what it is, none scored as a matrix."""
    g = torch.Generator().manual_seed(0)
    prefix = "model.layers.0.mlp.up_proj"
    state = {f"{prefix}.weight_packed": torch.randint(0, 256, (64, 64), generator=g, dtype=torch.uint8),
             f"{prefix}.weight_scale": torch.rand(64, 8, generator=g).to(torch.float8_e4m3fn),
             f"{prefix}.weight_global_scale": torch.tensor([448.0 * 6]), "fc.weight": torch.randn(8, 32, generator=g)}
    result = wbfe.score(state, metrics="bfe")
    assert [r["name"] for r in result.layers] == ["fc.weight"]
    why = (f"of {prefix}.weight, stored as uint8 packed FP4 values (fp4-pack-quantized), which wbfe does not "
           "dequantise: not scored")
    assert {s["name"]: s["reason"] for s in result.skipped} == {
        f"{prefix}.weight_packed": f"packed data {why}", f"{prefix}.weight_scale": f"scale {why}",
        f"{prefix}.weight_global_scale": f"global scale {why}"}


def test_three_bit_values_are_skipped_their_packing_differs_between_versions() -> None:
    """compressed-tensors 0.20 packs 3-bit values across word boundaries, earlier versions did not: skipped."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    q = torch.randint(-4, 4, (16, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int8)
    state = {"a.weight_packed": pack_to_int32(q, 3), "a.weight_shape": torch.tensor([16, 64]),
             "a.weight_scale": torch.full((16, 1), 0.01), "fc.weight": torch.randn(8, 32)}
    reasons = {s["name"]: s["reason"] for s in wbfe.score(state, metrics="bfe").skipped}
    assert reasons["a.weight_packed"] == (
        "packed data of a.weight, stored as 3-bit packed values, whose packing differs between compressed-tensors "
        "versions (wbfe reads 1, 2, 4 and 8 bits): not scored")


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_unpacking_inverts_the_packages_packer(bits: int) -> None:
    """Rows and, for zero points, columns: each count not a multiple of the values a word holds."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    g = torch.Generator().manual_seed(bits)
    q = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (7, 45), generator=g, dtype=torch.int8)
    assert torch.equal(unpack_values(pack_to_int32(q, bits), bits, 45, -1), q.long())
    assert torch.equal(unpack_values(pack_to_int32(q, bits, packed_dim=0), bits, 7, -2), q.long())


def test_dequantize_is_q_minus_z_times_s_per_group() -> None:
    """Closed form: two outputs, two groups of two inputs."""
    q = torch.tensor([[1, -2, 3, 0], [4, 5, -6, 7]], dtype=torch.int8)
    s = torch.tensor([[0.5, 2.0], [0.25, 1.0]])
    z = torch.tensor([[1, 0], [0, -1]], dtype=torch.int8)
    expected = torch.tensor([[0.0, -1.5, 6.0, 0.0], [1.0, 1.25, -5.0, 8.0]], dtype=torch.float64)
    assert torch.equal(dequantize_compressed(q, s, z, [1, 2]), expected)
    assert math.isclose(float(dequantize_compressed(q, s, None, [1, 2])[1, 3]), 7.0)


@pytest.mark.parametrize("layout", ["sparse-24-bitmask", "sparse-bitmask"])
def test_a_sparse_bitmask_weight_is_skipped_saying_so_and_its_values_are_no_matrix(layout: str) -> None:
    """compressed-tensors' sparse layouts (before 0.15; RedHatAI's 2:4 sparse models): ``<w>.weight.compressed``
    holds the kept values ([out, in/2] under 2:4, one row otherwise), ``.bitmask`` their positions (packed bits),
    ``.shape`` the matrix's and ``.row_offsets`` each row's first value. The 2:4 values were scored as a 64 x 32
    matrix of their own; every part is now a skipped row saying what it is."""
    g = torch.Generator().manual_seed(0)
    kept = torch.randn(64, 32, generator=g) if layout == "sparse-24-bitmask" else torch.randn(1000, generator=g)
    parts = {"compressed": kept, "bitmask": torch.randint(0, 256, (64, 8), generator=g, dtype=torch.uint8),
             "shape": torch.tensor([64, 64])}
    if layout == "sparse-bitmask":
        parts["row_offsets"] = torch.arange(64) * 16
    state = {f"l.weight.{part}": v for part, v in parts.items()} | {"fc.weight": torch.randn(8, 32, generator=g)}
    result = wbfe.score(state, metrics="bfe")
    assert [r["name"] for r in result.layers] == ["fc.weight"]
    what = {"compressed": "kept values", "bitmask": "bitmask", "shape": "shape", "row_offsets": "row offsets"}
    assert {s["name"]: s["reason"] for s in result.skipped} == {
        f"l.weight.{part}": f"{what[part]} of l.weight, stored as compressed-tensors' sparse bitmask layout (the "
                            "nonzero values, their positions in a bitmask), which wbfe does not decompress: not scored"
        for part in parts}


def test_the_edits_refuse_a_compressed_tensors_checkpoint_before_writing(tmp_path: Path) -> None:
    """Scored dequantised, a pack-quantized weight is still several stored tensors an edit could not write back: smooth,
    sharpen and prune refuse the file in one line naming the weight and its scheme, and write nothing."""
    from wbfe.editing import sharpen_checkpoint, smooth_checkpoint
    from wbfe.errors import UnsupportedDtypeError

    folder, _, _ = _checkpoint(tmp_path, {"num_bits": 4, "strategy": "group", "group_size": 16, "symmetric": False})
    out = tmp_path / "edits" / "out.safetensors"
    out.parent.mkdir()
    for edit in (lambda: smooth_checkpoint(folder, out, percent=0.5), lambda: sharpen_checkpoint(folder, out),
                 lambda: wbfe.prune(folder, out, target=0.5, exclude=())):
        with pytest.raises(UnsupportedDtypeError) as info:
            edit()
        assert str(info.value) == ("odd.weight: stored quantised (compressed-tensors-int4-g16); editing writes plain "
                                   "tensors and would not copy it byte for byte")
        assert list(out.parent.iterdir()) == []


def test_from_the_cli_the_score_reads_it_and_an_edit_exits_2_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from wbfe_cli.main import app

    folder, _, _ = _checkpoint(tmp_path, {"num_bits": 8, "strategy": "channel", "symmetric": True})
    result = CliRunner().invoke(app, ["score", str(folder), "--metrics", "bfe", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r["quant"] for r in json.loads(result.stdout)["layers"]}
    assert rows == {"head.weight": None, "odd.weight": "compressed-tensors-int8-channel",
                    "up.weight": "compressed-tensors-int8-channel"}
    out = tmp_path / "out.safetensors"
    result = CliRunner().invoke(app, ["smooth", str(folder), str(out), "--percent", "0.5"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "odd.weight: stored quantised (compressed-tensors-int8-channel)" in result.output and not out.exists()


def test_a_marlin_24_scale_is_no_matrix() -> None:
    """Marlin-24 (2:4 sparse 4-bit, compressed-tensors before 0.15): ``weight_packed``, ``scale_packed``, ``meta``.
    The float ``scale_packed`` was scored as a 4 x 64 matrix; it is a part of a weight wbfe cannot read."""
    state = {"l.weight_packed": torch.zeros(8, 64, dtype=torch.int32), "l.scale_packed": torch.rand(4, 64).half(),
             "l.meta": torch.zeros(8, 8, dtype=torch.int16), "fc.weight": torch.randn(8, 32)}
    result = wbfe.score(state, metrics="bfe")
    assert [r["name"] for r in result.layers] == ["fc.weight"]
    assert {s["name"]: s["reason"] for s in result.skipped}["l.scale_packed"] == (
        "quantized weight l unreadable: weight_packed without its weight_shape: the number of inputs is unknown")
