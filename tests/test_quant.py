"""Dequantisation against independent quantisers (compressed-tensors, transformers' own FP8 and MXFP4
code, and numpy packers written from the GPTQ/AWQ formats), then end to end from the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import wbfe
from wbfe.errors import CorruptCheckpointError
from wbfe.metrics.bfe import bfe_from_moments
from wbfe.quant.fp8 import dequantize_fp8, fp8_scheme
from wbfe.quant.mxfp4 import dequantize_mxfp4
from wbfe.quant.packed_int import dequantize_awq, dequantize_gptq

# AutoAWQ packs eight 4-bit columns into a word in this order (its pack order map).
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _bfe(w: torch.Tensor) -> float:
    m = w.double().reshape(w.shape[0], -1).numpy()
    e = np.linalg.eigvalsh(m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m)
    return bfe_from_moments(float(e.mean()), float(np.log(e).mean()), "opt")[0]


def _weights(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) / math.sqrt(cols)


# --- FP8 ------------------------------------------------------------------------------------------


def test_fp8_block128_matches_transformers_deepseek_quantiser() -> None:
    from transformers.integrations.finegrained_fp8 import Fp8Quantize, _dequantize_fp8_weight

    w = _weights(256, 384)
    quantizer = Fp8Quantize(SimpleNamespace(quantization_config=SimpleNamespace(weight_block_size=[128, 128],
                                                                                scale_fmt=None)))
    out = quantizer._quantize_one("x.weight", w)
    q, scale_inv = out["x.weight"], out["x.weight_scale_inv"]
    assert q.dtype == torch.float8_e4m3fn and tuple(scale_inv.shape) == (2, 3)
    ours = dequantize_fp8(q, scale_inv)
    reference = _dequantize_fp8_weight(q, scale_inv, [128, 128], torch.float64)
    assert torch.equal(ours, reference)
    assert fp8_scheme("float8_e4m3fn", q.shape, scale_inv.shape) == "fp8-e4m3-block128"
    assert float((ours - w.double()).abs().max()) < 0.07 * float(w.abs().max())  # e4m3: 3 mantissa bits


def test_fp8_partial_blocks_match_transformers() -> None:
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    q = (_weights(300, 200, seed=1) * 100).to(torch.float8_e4m3fn)
    scale = torch.rand(3, 2, generator=torch.Generator().manual_seed(2)) + 0.5
    assert torch.equal(dequantize_fp8(q, scale, [128, 128]),
                       _dequantize_fp8_weight(q, scale, [128, 128], torch.float64))
    assert fp8_scheme("float8_e4m3fn", q.shape, scale.shape, [128, 128]) == "fp8-e4m3-block128"


@pytest.mark.parametrize("strategy,scheme", [("channel", "fp8-e4m3-channel"), ("tensor", "fp8-e4m3-tensor")])
def test_fp8_compressed_tensors_scales(strategy: str, scheme: str) -> None:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize

    w = _weights(48, 96, seed=3)
    args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True)
    amax = w.abs().amax(dim=1, keepdim=True) if strategy == "channel" else w.abs().amax().reshape(1)
    scale = amax / 448.0
    q = quantize(w, scale, torch.zeros_like(scale), args, dtype=torch.float8_e4m3fn)
    reference = dequantize(q, scale, None, args)
    ours = dequantize_fp8(q, scale)
    assert fp8_scheme(str(q.dtype).removeprefix("torch."), q.shape, scale.shape) == scheme
    assert torch.allclose(ours, reference.double(), rtol=1e-7, atol=0)  # theirs rounds to float32
    assert _bfe(ours) == pytest.approx(_bfe(reference), rel=1e-6)


# --- MXFP4 ----------------------------------------------------------------------------------------


def _mxfp4_parts(experts: int, out: int, inp: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (experts, out, inp // 32, 16), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(118, 128, (experts, out, inp // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    return blocks, scales


def test_mxfp4_matches_transformers_gpt_oss_conversion() -> None:
    from transformers.integrations.mxfp4 import _convert_moe_packed_tensors

    blocks, scales = _mxfp4_parts(3, 40, 64)
    reference = _convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # exact: 2-bit mantissas
    ours = dequantize_mxfp4(blocks, scales)
    assert ours.shape == (3, 64, 40) and torch.equal(ours, reference.double())


# --- GPTQ and AWQ: numpy quantisers written from the formats ---------------------------------------


def _minmax_quantise(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric min-max quantisation of each column of ``w`` ([n, out]): q, scale, zero."""
    top = (1 << bits) - 1
    lo, hi = np.minimum(w.min(0), 0), np.maximum(w.max(0), 0)
    scale = ((hi - lo) / top).astype(np.float16).astype(np.float64)
    zero = np.clip(np.round(-lo / scale), 0, top)
    q = np.clip(np.round(w / scale) + zero, 0, top)
    return q.astype(np.int64), scale, zero.astype(np.int64)


def _pack(values: np.ndarray, bits: int, axis: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """Pack along ``axis``: word j slot k holds entry ``n·j + order[k]`` in bits ``bits·k``."""
    n = 32 // bits
    v = np.moveaxis(values, axis, -1)
    v = v.reshape(*v.shape[:-1], -1, n)
    if order is not None:
        v = v[..., list(order)]
    words = np.zeros(v.shape[:-1], dtype=np.uint64)
    for k in range(n):
        words |= v[..., k].astype(np.uint64) << np.uint64(bits * k)
    return np.moveaxis(words.astype(np.uint32).view(np.int32), -1, axis)


def _gptq(w: torch.Tensor, bits: int, group: int, act_order: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """GPTQ's tensors for ``w`` [out, in]: rows of Wᵀ grouped by g_idx (a permutation with act-order)."""
    wt = w.double().numpy().T  # [in, out]
    n_in = wt.shape[0]
    g_idx = np.arange(n_in) // group
    if act_order:
        g_idx = g_idx[np.random.default_rng(seed).permutation(n_in)]
    groups = n_in // group
    q = np.zeros_like(wt, dtype=np.int64)
    scales, zeros = np.zeros((groups, wt.shape[1])), np.zeros((groups, wt.shape[1]), dtype=np.int64)
    for gi in range(groups):
        rows = g_idx == gi
        q[rows], scales[gi], zeros[gi] = _minmax_quantise(wt[rows], bits)
    deq = (scales[g_idx] * (q - zeros[g_idx])).T
    return {"qweight": torch.from_numpy(_pack(q, bits, 0)), "qzeros": torch.from_numpy(_pack(zeros - 1, bits, 1)),
            "scales": torch.from_numpy(scales.astype(np.float16)), "g_idx": torch.from_numpy(g_idx.astype(np.int32)),
            "expected": torch.from_numpy(deq)}


def _awq(w: torch.Tensor, bits: int, group: int) -> dict[str, torch.Tensor]:
    wt = w.double().numpy().T
    groups = wt.shape[0] // group
    q = np.zeros_like(wt, dtype=np.int64)
    scales, zeros = np.zeros((groups, wt.shape[1])), np.zeros((groups, wt.shape[1]), dtype=np.int64)
    for gi in range(groups):
        q[gi * group:(gi + 1) * group], scales[gi], zeros[gi] = _minmax_quantise(wt[gi * group:(gi + 1) * group], bits)
    deq = (np.repeat(scales, group, 0) * (q - np.repeat(zeros, group, 0))).T
    return {"qweight": torch.from_numpy(_pack(q, bits, 1, AWQ_PACK_ORDER)),
            "qzeros": torch.from_numpy(_pack(zeros, bits, 1, AWQ_PACK_ORDER)),
            "scales": torch.from_numpy(scales.astype(np.float16)), "expected": torch.from_numpy(deq)}


@pytest.mark.parametrize("bits,act_order", [(4, False), (4, True), (8, True)])
def test_gptq_against_a_numpy_quantiser(bits: int, act_order: bool) -> None:
    w = _weights(64, 128, seed=4)
    t = _gptq(w, bits, 32, act_order)
    ours = dequantize_gptq(t["qweight"], t["qzeros"], t["scales"], bits=bits, group_size=32,
                           g_idx=t["g_idx"] if act_order else None)
    assert torch.equal(ours, t["expected"])
    assert float((ours - w.double()).abs().max()) < (0.2 if bits == 4 else 0.02)
    assert _bfe(ours) == pytest.approx(_bfe(t["expected"]), rel=1e-12)


def test_awq_against_a_numpy_quantiser() -> None:
    w = _weights(64, 128, seed=5)
    t = _awq(w, 4, 32)
    ours = dequantize_awq(t["qweight"], t["qzeros"], t["scales"], bits=4, group_size=32)
    assert torch.equal(ours, t["expected"])
    assert float((ours - w.double()).abs().max()) < 0.2


# --- Whole checkpoints in each family's layout, from the CLI ---------------------------------------


def _folder(tmp_path: Path, name: str, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    from safetensors.torch import save_file

    folder = tmp_path / name
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _cli_score(folder: Path) -> dict:
    from wbfe_cli.main import app

    result = CliRunner().invoke(app, ["score", str(folder), "--metrics", "bfe", "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _accounted(data: dict, folder: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    seen = {r["name"] for r in data["layers"]} | {s["name"] for s in data["skipped"]}
    assert stored <= seen, stored - seen
    return {s["name"]: s["reason"] for s in data["skipped"]}


def _llama_layer(prefix: str, h: int, i: int, seed: int) -> dict[str, torch.Tensor]:
    shapes = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (h, h), "self_attn.v_proj": (h, h),
              "self_attn.o_proj": (h, h), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}
    return {f"{prefix}.{k}": _weights(*s, seed=seed + n) for n, (k, s) in enumerate(shapes.items())}


def test_deepseek_style_fp8_checkpoint_scores_from_the_cli(tmp_path: Path) -> None:
    from transformers.integrations.finegrained_fp8 import Fp8Quantize, _dequantize_fp8_weight

    quantizer = Fp8Quantize(SimpleNamespace(quantization_config=SimpleNamespace(weight_block_size=[128, 128],
                                                                                scale_fmt=None)))
    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _weights(512, 256).bfloat16(),
                                        "lm_head.weight": _weights(512, 256, seed=9).bfloat16(),
                                        "model.norm.weight": torch.ones(256).bfloat16()}
    expected = {}
    for name, w in _llama_layer("model.layers.0", 256, 384, 10).items():
        out = quantizer._quantize_one(f"{name}.weight", w)
        tensors.update(out)
        expected[f"{name}.weight"] = _dequantize_fp8_weight(out[f"{name}.weight"], out[f"{name}.weight_scale_inv"],
                                                            [128, 128], torch.float64)
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 512,
              "tie_word_embeddings": False,
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    folder = _folder(tmp_path, "fp8", tensors, config)
    data = _cli_score(folder)
    reasons = _accounted(data, folder)
    rows = {r["name"]: r for r in data["layers"]}
    for name, reference in expected.items():
        assert rows[name]["quant"] == "fp8-e4m3-block128" and rows[name]["bfe"] == pytest.approx(_bfe(reference), rel=1e-9)
        assert reasons[f"{name}_scale_inv"] == f"consumed: scale of {name}"
    assert rows["lm_head.weight"]["quant"] is None and data["summary"]["head"] == "lm_head.weight"


def test_gptq_and_awq_checkpoints_score_from_the_cli(tmp_path: Path) -> None:
    for method in ("gptq", "awq"):
        tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _weights(300, 128).half(),
                                            "lm_head.weight": _weights(300, 128, seed=1).half()}
        expected = {}
        for name, w in _llama_layer("model.layers.0", 128, 256, 20).items():
            t = _gptq(w, 4, 32, act_order=True) if method == "gptq" else _awq(w, 4, 32)
            expected[f"{name}.weight"] = t.pop("expected")
            tensors.update({f"{name}.{part}": v for part, v in t.items()})
            tensors[f"{name}.bias"] = torch.zeros(w.shape[0]).half()
        qconfig = ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False}
                   if method == "gptq" else {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm",
                                             "zero_point": True})
        config = {"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "tie_word_embeddings": False,
                  "quantization_config": qconfig}
        folder = _folder(tmp_path, method, tensors, config)
        data = _cli_score(folder)
        reasons = _accounted(data, folder)
        rows = {r["name"]: r for r in data["layers"]}
        for name, reference in expected.items():
            assert rows[name]["quant"] == f"{method}-int4-g32"
            assert rows[name]["shape"] == list(reference.shape)
            assert rows[name]["bfe"] == pytest.approx(_bfe(reference), rel=1e-9)
            prefix = name.removesuffix(".weight")
            assert reasons[f"{prefix}.qzeros"] == f"consumed: zero points of {name}"
            assert reasons[f"{prefix}.qweight"].startswith(f"consumed: packed data of {name}")
        assert data["summary"]["head"] == "lm_head.weight"
        assert not any(s["reason"].startswith(("integer", "unsupported")) for s in data["skipped"])


def test_gptq_8bit_from_quantize_config_json(tmp_path: Path) -> None:
    """AutoGPTQ's own layout: no quantization_config in config.json, a quantize_config.json beside it."""
    from safetensors.torch import save_file

    w = _weights(64, 128, seed=6)
    t = _gptq(w, 8, 64, act_order=False)
    expected = t.pop("expected")
    folder = tmp_path / "gptq8"
    folder.mkdir()
    save_file({f"layers.0.mlp.up_proj.{k}": v.contiguous() for k, v in t.items()} | {"head.weight": _weights(5, 64)},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    (folder / "quantize_config.json").write_text(json.dumps({"bits": 8, "group_size": 64, "desc_act": False}))
    result = wbfe.score(folder, metrics="bfe")
    row = next(r for r in result.layers if r["name"] == "layers.0.mlp.up_proj.weight")
    assert row["quant"] == "gptq-int8-g64" and row["bfe"] == pytest.approx(_bfe(expected), rel=1e-9)
    # The config's bit width must be the tensors': a 4-bit claim on 8-bit words is refused for that weight.
    (folder / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 64}))
    result = wbfe.score(folder, metrics="bfe")
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    assert "config says 4 bits, the tensors hold 8" in reasons["layers.0.mlp.up_proj.qweight"]
    assert "layers.0.mlp.up_proj.weight" not in {r["name"] for r in result.layers}


def test_fp8_e5m2_per_tensor_and_bad_parts() -> None:
    w = _weights(20, 30, seed=8)
    scale = torch.tensor(0.01)
    q = (w / scale).to(torch.float8_e5m2)
    state = {"a.weight": q, "a.weight_scale": scale, "b.weight": q.clone(), "b.weight_scale": torch.ones(4, 7),
             "c.weight": q.clone(), "fc.weight": _weights(4, 20)}
    result = wbfe.score(state, metrics="bfe")
    rows = {r["name"]: r for r in result.layers}
    assert rows["a.weight"]["quant"] == "fp8-e5m2-tensor"
    assert rows["a.weight"]["bfe"] == pytest.approx(_bfe(q.double() * 0.01), rel=1e-12)
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    assert "fits no layout" in reasons["b.weight"] and "fits no layout" in reasons["b.weight_scale"]
    assert reasons["c.weight"].startswith("FP8 weight without its scale")


@pytest.mark.parametrize("block", [[0, 128], [128], "128", 128, [None, None], [128.5, 128], [True, True],
                                   [float("inf"), 128]])
def test_fp8_a_malformed_weight_block_size_skips_the_weight_saying_why(tmp_path: Path, block: object) -> None:
    """ZeroDivisionError, IndexError, TypeError or OverflowError escaped from the layout check; 128.5 was cut to 128."""
    q = (_weights(256, 256) * 100).to(torch.float8_e4m3fn)
    tensors = {"a.weight": q, "a.weight_scale_inv": torch.ones(2, 2), "fc.weight": _weights(4, 20)}
    folder = _folder(tmp_path, "fp8", tensors, {"quantization_config": {"quant_method": "fp8",
                                                                       "weight_block_size": block}})
    data = _cli_score(folder)
    reasons = _accounted(data, folder)
    assert reasons["a.weight"] == f"quantized weight a unreadable: FP8 weight_block_size {block!r} is not two " \
                                  "positive whole numbers"
    with pytest.raises(CorruptCheckpointError, match="weight_block_size"):
        fp8_scheme("float8_e4m3fn", [256, 256], [2, 2], block)  # type: ignore[arg-type]
    # A whole float block (128.0) is the block it names; a per-tensor scale never reads the block.
    assert fp8_scheme("float8_e4m3fn", [256, 256], [2, 2], [128.0, 128.0]) == "fp8-e4m3-block128"
    assert fp8_scheme("float8_e4m3fn", [256, 256], [], block) == "fp8-e4m3-tensor"  # type: ignore[arg-type]


def test_fp8_a_one_dimensional_weight_with_a_per_tensor_scale_is_planned_as_a_vector() -> None:
    """IndexError escaped from the layout check (``weight_shape[-2]``)."""
    state = {"a.weight": torch.ones(16).to(torch.float8_e4m3fn), "a.weight_scale": torch.tensor(0.5),
             "b.weight": torch.ones(16).to(torch.float8_e4m3fn), "b.weight_scale": torch.ones(4),
             "fc.weight": _weights(4, 20)}
    reasons = {s["name"]: s["reason"] for s in wbfe.score(state, metrics="bfe").skipped}
    assert reasons["a.weight"] == "1-D tensor (bias, norm scale or buffer)"
    assert reasons["b.weight"].startswith("quantized weight b unreadable: FP8 scale of shape [4] fits no layout")


@pytest.mark.parametrize("empty", ["groups", "outputs"])
def test_gptq_scales_with_a_zero_dimension_skip_the_weight_saying_why(empty: str) -> None:
    """ZeroDivisionError escaped from the packing check (no groups, or no outputs)."""
    t = _gptq(_weights(32, 64), 4, 32, act_order=False)
    t.pop("expected")
    if empty == "groups":
        t["scales"], t["qzeros"] = t["scales"][:0], t["qzeros"][:0]
    else:
        t = {"qweight": t["qweight"][:, :0], "qzeros": t["qzeros"][:, :0], "scales": t["scales"][:, :0]}
    state = {f"l.{k}": v for k, v in t.items() if k != "g_idx"} | {"fc.weight": _weights(4, 20)}
    reasons = {s["name"]: s["reason"] for s in wbfe.score(state, metrics="bfe").skipped}
    shapes = {k: list(v.shape) for k, v in t.items()}
    assert reasons["l.qweight"] == (f"quantized weight l unreadable: qweight {shapes['qweight']}, qzeros "
                                    f"{shapes['qzeros']}, scales {shapes['scales']}")


@pytest.mark.parametrize("bits", ["four", 4.5, float("nan"), 10**400, True])
def test_gptq_a_config_bit_width_that_is_not_the_tensors_is_refused_for_that_weight(tmp_path: Path,
                                                                                    bits: object) -> None:
    """``int(bits)`` raised ValueError for "four" or NaN, and cut 4.5 to 4, which then passed."""
    t = _gptq(_weights(32, 64), 4, 32, act_order=False)
    t.pop("expected")
    tensors = {f"l.{k}": v for k, v in t.items()} | {"fc.weight": _weights(4, 20)}
    folder = _folder(tmp_path, "gptq", tensors, {"quantization_config": {"quant_method": "gptq", "bits": bits}})
    reasons = _accounted(_cli_score(folder), folder)
    assert reasons["l.qweight"] == f"quantized weight l unreadable: config says {bits} bits, the tensors hold 4"
    for same in (4, 4.0, "4"):  # the same number, however the config writes it
        (folder / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq", "bits": same}}))
        assert "l.weight" in {r["name"] for r in wbfe.score(folder, metrics="bfe").layers}


def test_gptq_packed_words_that_are_not_integers_skip_the_weight_saying_why() -> None:
    """A float32 qweight was cast value by value to int64 and unpacked as bits: a garbage matrix, scored."""
    t = _gptq(_weights(32, 64), 4, 32, act_order=False)
    t.pop("expected")
    state = {f"l.{k}": v for k, v in t.items()} | {"l.qweight": t["qweight"].float(), "fc.weight": _weights(4, 20)}
    result = wbfe.score(state, metrics="bfe")
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    assert "l.weight" not in {r["name"] for r in result.layers}
    assert reasons["l.qweight"] == ("quantized weight l unreadable: qweight of float32 and qzeros of int32: GPTQ and "
                                    "AWQ pack int32 words")



@pytest.mark.parametrize("block, bits, group, whole", [
    (128, 4, 32, True), (128.0, 4.0, 32.0, True), ("128", "4", "32", True), ("128.0", "4.0", "32.0", True),
    (True, True, True, False), (128.5, 4.5, 32.5, False), ("many", "many", "many", False),
    (math.nan, math.nan, math.nan, False)])
def test_a_config_number_is_read_alike_for_an_fp8_block_a_bit_width_and_a_group_size(
        tmp_path: Path, block: object, bits: object, group: object, whole: bool) -> None:
    """One reading of a quantization config's numbers (``config_whole``): the number however written, a bool none.
    A GPTQ group size written "32" or "32.0" was refused (compared as text) while bits "4" passed; an FP8 block of
    "128.0" was refused while bits "4.0" passed."""
    sizes: Any = [block, 128]
    if whole:
        assert fp8_scheme("float8_e4m3fn", [256, 256], [2, 2], sizes) == "fp8-e4m3-block128"
    else:
        with pytest.raises(CorruptCheckpointError, match="weight_block_size .* is not two positive whole numbers"):
            fp8_scheme("float8_e4m3fn", [256, 256], [2, 2], sizes)
    t = _gptq(_weights(32, 64), 4, 32, act_order=False)
    t.pop("expected")
    tensors = {f"l.{k}": v for k, v in t.items()} | {"fc.weight": _weights(4, 20)}
    for key, value, refusal in (("bits", bits, f"config says {bits} bits"),
                                ("group_size", group, f"config's group size {group} does not fit")):
        folder = _folder(tmp_path, key, tensors, {"quantization_config": {"quant_method": "gptq", key: value}})
        result = wbfe.score(folder, metrics="bfe")
        rows = {r["name"]: r for r in result.layers}
        if whole:
            assert rows["l.weight"]["quant"] == "gptq-int4-g32", key
        else:
            reasons = {s["name"]: s["reason"] for s in result.skipped}
            assert "l.weight" not in rows and refusal in reasons["l.qweight"], key


def test_an_mxfp4_nan_scale_skips_that_weight_alone() -> None:
    """The E8M0 code 255 is NaN (OCP MX spec): that weight is skipped for its non-finite values, the rest scored, as a
    NaN scale of TFLite or ONNX (tests/test_tflite.py). It refused the whole checkpoint when the weight was read."""
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (4, 8, 2, 16), generator=g, dtype=torch.uint8)
    scales = torch.full((4, 8, 2), 127, dtype=torch.uint8)
    nan = scales.clone()
    nan[1, 2, 0] = 255
    fc = _weights(4, 20)
    result = wbfe.score({"e.w_blocks": blocks, "e.w_scales": nan, "f.w_blocks": blocks.clone(), "f.w_scales": scales,
                         "fc.weight": fc}, metrics="bfe")
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    assert reasons["e.w"] == "non-finite values (NaN or Inf)"
    whole = wbfe.score({"f.w_blocks": blocks, "f.w_scales": scales, "fc.weight": fc}, metrics="bfe")
    assert [(r["name"], r["bfe"]) for r in result.layers] == [(r["name"], r["bfe"]) for r in whole.layers]


def test_a_gptq_qweight_of_other_outputs_than_its_scales_skips_that_weight() -> None:
    """A GPTQ qweight whose columns are not its scales' outputs is refused when planned, for that weight; it was
    refused when read, which stopped the whole run."""
    t = _gptq(_weights(32, 64), 4, 32, act_order=False)
    t.pop("expected")
    t["qweight"] = t["qweight"][:, :16]
    qconfig = {"quant_method": "gptq"}
    state = {f"l.{k}": v for k, v in t.items()} | {"fc.weight": _weights(4, 20)}
    from wbfe.quant import dequantised
    from wbfe.sources import open_source

    with open_source(state) as source:
        reasons = {e.name: why for e, why in dequantised(source.entries(), {"quantization_config": qconfig})}
    assert reasons["l.qweight"] == ("quantized weight l unreadable: packing of qweight [8, 16] / qzeros [2, 4] for 32 "
                                    "outputs is no 2-, 4- or 8-bit layout")


@pytest.mark.parametrize("bad", ["short", "2-D", "float"])
def test_a_gptq_g_idx_of_the_wrong_shape_or_dtype_skips_that_weight_when_planned(bad: str) -> None:
    """A g_idx that is not one whole group index per input was refused when the weight was read, which stopped the
    whole run; a float one was cut to whole numbers. It is seen when planned, and skips that weight alone."""
    t = _gptq(_weights(32, 64), 4, 32, act_order=True)
    t.pop("expected")
    g = t["g_idx"]
    t["g_idx"] = {"short": g[:63], "2-D": g.reshape(8, 8), "float": g.float()}[bad]
    fc = _weights(4, 20)
    result = wbfe.score({f"l.{k}": v for k, v in t.items()} | {"fc.weight": fc}, metrics="bfe")
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    dtype, shape = {"short": ("int32", [63]), "2-D": ("int32", [8, 8]), "float": ("float32", [64])}[bad]
    for part in ("qweight", "qzeros", "scales", "g_idx"):
        assert reasons[f"l.{part}"] == (f"quantized weight l unreadable: GPTQ g_idx of {dtype} {shape}: expected "
                                        "whole group indexes [64]")
    assert [r["name"] for r in result.layers] == ["fc.weight"]


@pytest.mark.parametrize("index", [-1, 2])
def test_a_gptq_group_index_out_of_range_skips_that_weight_alone(index: int) -> None:
    """A group index outside the scales' groups leaves that input without a scale: dequantised, its column is NaN.
    The g_idx is read when the weight is planned, and the weight skipped saying which group index is out of range,
    the rest scored. It raised when read, which stopped the whole run; then it was skipped for "non-finite values",
    which the stored values are not."""
    t = _gptq(_weights(32, 64), 4, 32, act_order=True)
    expected = t.pop("expected")
    g = t["g_idx"].clone()
    g[5] = index
    ours = dequantize_gptq(t["qweight"], t["qzeros"], t["scales"], bits=4, group_size=32, g_idx=g)
    assert torch.isnan(ours[:, 5]).all() and not torch.isnan(ours[:, [4, 6]]).any()
    keep = [c for c in range(64) if c != 5]
    assert torch.equal(ours[:, keep], expected[:, keep])
    fc = _weights(4, 20)
    result = wbfe.score({f"l.{k}": v for k, v in t.items()} | {"l.g_idx": g, "fc.weight": fc}, metrics="bfe")
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    for part in ("qweight", "qzeros", "scales", "g_idx"):
        assert reasons[f"l.{part}"] == ("quantized weight l unreadable: GPTQ g_idx gives 1 of its 64 inputs a group "
                                        f"outside the 2 of its scales (input 5: group {index}, expected 0 to 1)")
    assert "l.weight" not in reasons
    whole = wbfe.score({"fc.weight": fc}, metrics="bfe")
    assert [(r["name"], r["bfe"]) for r in result.layers] == [(r["name"], r["bfe"]) for r in whole.layers]


def test_an_fp8_block_of_unequal_sides_is_named_as_shapes_are_written() -> None:
    """A 128×64 block is named with the shape text of the tables (``render.text.shape_text``), a square one by its
    side."""
    assert fp8_scheme("float8_e4m3fn", [256, 256], [2, 4], [128, 64]) == "fp8-e4m3-block128x64"
    assert fp8_scheme("float8_e4m3fn", [256, 256], [2, 2], [128, 128]) == "fp8-e4m3-block128"


@pytest.mark.parametrize("missing", ["qweight", "qzeros"])
def test_a_gptq_weight_missing_a_part_skips_every_part_saying_why(missing: str) -> None:
    """A GPTQ group without its packed words or zero points: every part is a skipped row with its reason, the float
    scales included (its integer parts show it is a quantised weight, so the scales are no matrix); a missing qzeros
    raised KeyError. A float parameter named ``scales`` with no integer part beside it is still a plain matrix."""
    t = _gptq(_weights(32, 64), 4, 32, act_order=False)
    t.pop("expected")
    t.pop(missing)
    alone = _weights(6, 40, seed=3)
    state = {f"l.{k}": v for k, v in t.items()} | {"fc.weight": _weights(4, 20), "norm.scales": alone}
    result = wbfe.score(state, metrics="bfe")
    reasons = {s["name"]: s["reason"] for s in result.skipped}
    what = {"qweight": "packed data", "qzeros": "zero points", "scales": "scales", "g_idx": "group index"}
    assert {name: reasons[f"l.{name}"] for name in t} == {
        name: f"{what[name]} of a quantized weight whose other parts are missing" for name in t}
    rows = {r["name"]: r for r in result.layers}
    assert sorted(rows) == ["fc.weight", "norm.scales"]
    assert rows["norm.scales"]["bfe"] == wbfe.score({"norm.scales": alone}, metrics="bfe").layers[0]["bfe"]


@pytest.mark.parametrize("layout", ["pack-quantized", "int-quantized"])
def test_a_compressed_tensors_integer_layer_is_scored_dequantised_and_its_scale_is_no_matrix(tmp_path: Path,
                                                                                            layout: str) -> None:
    """compressed-tensors' integer layouts (llm-compressor's W4A16 and W8A8 checkpoints): int4 values packed in int32
    words (``weight_packed``, by the package's own ``pack_to_int32``) or int8 values as the ``weight``, a bfloat16
    ``weight_scale`` per group of 32 inputs, ``weight_shape`` or ``weight_zero_point``. The weight is scored as
    q·s (its zero point 0), its parts consumed. The 256 × 4 float scale was once scored as a weight matrix, and an
    edit smoothed it; an edit refuses the file. An integer ``weight`` with no scale beside it keeps its reason.
    (tests/test_compressed_tensors.py: checkpoints written by the package, against its own decompression.)"""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    from wbfe.editing import smooth_checkpoint
    from wbfe.errors import UnsupportedDtypeError

    g = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (256, 128), generator=g, dtype=torch.int8)
    prefix = "model.layers.0.mlp.up_proj"
    parts = ({"weight_packed": pack_to_int32(q, 4), "weight_shape": torch.tensor([256, 128])}
             if layout == "pack-quantized" else {"weight": q, "weight_zero_point": torch.zeros(256, 4, dtype=torch.int8)})
    parts["weight_scale"] = (torch.rand(256, 4, generator=g) * 0.01).to(torch.bfloat16)
    tensors = {"lm_head.weight": _weights(300, 128, seed=1).half(), "counter.weight": torch.arange(12).reshape(3, 4)}
    tensors |= {f"{prefix}.{part}": v for part, v in parts.items()}
    qconfig = {"quant_method": "compressed-tensors", "format": layout}
    folder = _folder(tmp_path, "ct", tensors, {"architectures": ["LlamaForCausalLM"], "quantization_config": qconfig})
    result = wbfe.score(folder, metrics="bfe")
    rows = {r["name"]: r for r in result.layers}
    assert sorted(rows) == ["lm_head.weight", f"{prefix}.weight"]
    expected = q.double() * parts["weight_scale"].double().repeat_interleave(32, dim=1)
    scheme = "compressed-tensors-int4-g32" if layout == "pack-quantized" else "compressed-tensors-int8-g32"
    assert rows[f"{prefix}.weight"]["quant"] == scheme
    assert rows[f"{prefix}.weight"]["bfe"] == pytest.approx(_bfe(expected), rel=1e-9)
    what = {"weight_packed": "packed data", "weight_shape": "shape", "weight_zero_point": "zero points",
            "weight_scale": "scale"}
    assert {s["name"]: s["reason"] for s in result.skipped} == {
        "counter.weight": "integer tensor (int64): quantized/packed weights or a counter",
        **{f"{prefix}.{part}": f"consumed: {what[part]} of {prefix}.weight" for part in parts if part != "weight"},
        **({f"{prefix}.weight_packed": f"consumed: packed data of {prefix}.weight (scored dequantised)"}
           if layout == "pack-quantized" else {})}
    with pytest.raises(UnsupportedDtypeError) as info:
        smooth_checkpoint(folder, tmp_path / "out.safetensors", percent=0.5)
    assert str(info.value).startswith(f"{prefix}.weight: stored quantised ({scheme}); editing writes")
    assert not (tmp_path / "out.safetensors").exists()
