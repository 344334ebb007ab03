"""``wbfe.compare`` / ``wbfe compare``: against numpy, A vs A, antisymmetry, dtypes, sharding, renames."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from scipy.stats import wasserstein_distance
from typer.testing import CliRunner

import wbfe
from wbfe_cli.main import app


def _pair(seed: int = 0) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    a = {
        "layers.0.attn.weight": torch.randn(40, 60, generator=g, dtype=torch.float64),
        "layers.0.mlp.weight": torch.randn(90, 30, generator=g, dtype=torch.float64),  # dual form
        "layers.1.mlp.weight": torch.randn(300, 400, generator=g, dtype=torch.float64),  # ARPACK path
        "layers.1.conv.weight": torch.randn(16, 8, 3, 3, generator=g, dtype=torch.float64),
        "layers.1.norm.weight": torch.ones(30, dtype=torch.float64),
    }
    b = {}
    for name, w in a.items():
        low = torch.randn(w.shape[0], 3, generator=g, dtype=torch.float64) @ torch.randn(3, w[0].numel(), generator=g, dtype=torch.float64)
        b[name] = w + 0.3 * low.reshape(w.shape) if w.ndim > 1 else w * 1.5
    return a, b


def _eigs(m: np.ndarray) -> np.ndarray:
    return np.sort(np.linalg.svd(m, compute_uv=False) ** 2)


def _bfe(e: np.ndarray) -> float:
    return 0.5 * (math.log(2 * math.pi) + 1) + 0.5 * (math.log(e.mean()) - np.log(e).mean())


def _overlap(x: np.ndarray, y: np.ndarray, k: int) -> tuple[float, float]:
    ux, _, vxt = np.linalg.svd(x, full_matrices=False)
    uy, _, vyt = np.linalg.svd(y, full_matrices=False)
    return (float(np.sum((vxt[:k] @ vyt[:k].T) ** 2) / k), float(np.sum((ux[:, :k].T @ uy[:, :k]) ** 2) / k))


def test_against_numpy() -> None:
    a, b = _pair()
    result = wbfe.compare(a, b, metrics="bfe,htsr", top_k=4)
    rows = {row["name"]: row for row in result.layers}
    assert set(rows) == {"layers.0.attn.weight", "layers.0.mlp.weight", "layers.1.mlp.weight", "layers.1.conv.weight"}
    for name, row in rows.items():
        x = a[name].reshape(a[name].shape[0], -1).numpy()
        y = b[name].reshape(b[name].shape[0], -1).numpy()
        d = y - x
        ex, ey, ed = _eigs(x), _eigs(y), np.linalg.svd(d, compute_uv=False)
        assert row["rel_frobenius"] == pytest.approx(np.linalg.norm(d) / np.linalg.norm(x), rel=1e-12)
        assert row["stable_rank_delta"] == pytest.approx(np.sum(ed ** 2) / ed[0] ** 2, rel=1e-8)
        assert row["w1_log_eigs"] == pytest.approx(wasserstein_distance(np.log(ex), np.log(ey)), rel=1e-8, abs=1e-12)
        assert row["bfe_a"] == pytest.approx(_bfe(ex), rel=1e-10)
        assert row["d_bfe"] == pytest.approx(_bfe(ey) - _bfe(ex), rel=1e-8, abs=1e-12)
        assert row["d_stable_rank"] == pytest.approx(ey.sum() / ey[-1] - ex.sum() / ex[-1], rel=1e-8, abs=1e-10)
        overlap_in, overlap_out = _overlap(x, y, 4)
        assert row["overlap_in"] == pytest.approx(overlap_in, abs=1e-8)
        assert row["overlap_out"] == pytest.approx(overlap_out, abs=1e-8)
    # The metrics on each side are those `wbfe score` gives.
    scored = {row["name"]: row for row in wbfe.score(b, metrics="bfe,htsr").layers}
    for name, row in rows.items():
        assert row["alpha_b"] == pytest.approx(scored[name]["alpha"], rel=1e-9)
        assert row["bfe_b"] == pytest.approx(scored[name]["bfe"], rel=1e-12)
    assert [s["name"] for s in result.skipped] == ["layers.1.norm.weight"]
    assert "1-D" in result.skipped[0]["reason"]
    top = result.summary["most_changed"][0]
    assert top["rel_frobenius"] == max(row["rel_frobenius"] for row in result.layers)


def test_a_against_itself() -> None:
    a, _ = _pair(1)
    result = wbfe.compare(a, a, metrics="bfe,htsr,htmp")
    for row in result.layers:
        assert row["rel_frobenius"] == 0.0 and row["w1_log_eigs"] == 0.0 and row["spectral_delta"] == 0.0
        assert row["overlap_in"] == pytest.approx(1.0, abs=1e-12) and row["overlap_out"] == pytest.approx(1.0, abs=1e-12)
        assert math.isnan(row["stable_rank_delta"]) and "B − A = 0" in row["reasons"]["stable_rank_delta"]
        for key, value in row.items():
            if key.startswith("d_") and isinstance(value, float) and math.isfinite(value):
                assert value == 0.0, key
            if key.endswith("_a") and key[:-2] + "_b" in row:
                va, vb = value, row[key[:-2] + "_b"]
                assert va == vb or (isinstance(va, float) and math.isnan(va) and math.isnan(vb)), key


def test_a_vs_b_is_the_negated_b_vs_a() -> None:
    a, b = _pair(2)
    ab = {row["name"]: row for row in wbfe.compare(a, b, metrics="bfe,htsr").layers}
    ba = {row["name"]: row for row in wbfe.compare(b, a, metrics="bfe,htsr").layers}
    for name, row in ab.items():
        other = ba[name]
        for key, value in row.items():
            if key.startswith("d_") and isinstance(value, float) and math.isfinite(value):
                assert other[key] == pytest.approx(-value, rel=1e-12, abs=1e-15), key
        for key in ("w1_log_eigs", "stable_rank_delta", "overlap_in", "overlap_out", "frobenius_delta"):
            assert other[key] == pytest.approx(row[key], rel=1e-8), key
        # ‖B − A‖/‖A‖ is not symmetric: the other way round divides by ‖B‖.
        norm_b = np.linalg.norm(b[name].numpy())
        assert other["rel_frobenius"] == pytest.approx(row["frobenius_delta"] / norm_b, rel=1e-12)


def test_across_dtypes_and_sharding(tmp_path, monkeypatch) -> None:
    a, _ = _pair(3)
    a32 = {k: v.float().contiguous() for k, v in a.items()}
    save_file(a32, str(tmp_path / "a.safetensors"))
    folder = tmp_path / "b"
    folder.mkdir()
    b16 = {k: v.to(torch.bfloat16).contiguous() for k, v in a32.items()}
    names = list(b16)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    for shard, keys in shards.items():
        save_file({k: b16[k] for k in keys}, str(folder / shard))
    index = {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    from wbfe.sources import safetensors_files

    reads: dict[tuple, int] = {}
    original = safetensors_files._load_tensor

    def counting(fh, data_start, info, *rest):
        key = (fh.name, tuple(info["data_offsets"]))
        reads[key] = reads.get(key, 0) + 1
        return original(fh, data_start, info, *rest)

    monkeypatch.setattr(safetensors_files, "_load_tensor", counting)
    result = wbfe.compare(tmp_path / "a.safetensors", folder, metrics="bfe")
    assert max(reads.values()) == 1  # each tensor read once
    assert len(result.layers) == 4 and not result.unmatched
    assert result.model_b["format"] == "safetensors-sharded"
    for row in result.layers:
        x = a32[row["name"]].reshape(row["rows"], -1).double().numpy()
        y = b16[row["name"]].reshape(row["rows"], -1).double().numpy()
        assert row["dtype_a"] == "float32" and row["dtype_b"] == "bfloat16"
        assert row["rel_frobenius"] == pytest.approx(np.linalg.norm(y - x) / np.linalg.norm(x), rel=1e-10)
        assert 1e-4 < row["rel_frobenius"] < 2 ** -8  # bfloat16 rounding: 8 bits of mantissa


def test_renames_and_unmatched() -> None:
    a, b = _pair(4)
    renamed = {"model." + k: v for k, v in b.items()}
    renamed["model.extra.weight"] = torch.randn(20, 20, dtype=torch.float64)
    plain = wbfe.compare(a, {**renamed, "layers.0.attn.weight": b["layers.0.attn.weight"]}, metrics="bfe")
    assert {u["name"] for u in plain.unmatched if u["side"] == "a"} == set(a) - {"layers.0.attn.weight"}
    assert all("no tensor" in u["reason"] for u in plain.unmatched if u["side"] == "a")
    mapped = wbfe.compare(a, renamed, metrics="bfe", name_map=["^layers=model.layers"])
    assert len(mapped.layers) == 4 and mapped.layers[0]["name_b"].startswith("model.layers.")
    assert mapped.unmatched == [{"name": "model.extra.weight", "side": "b", "reason": "no tensor of A maps to this name"}]
    # Every tensor is accounted for.
    assert len(mapped.layers) + len(mapped.skipped) == len(a)
    # Two of A's names onto one of B's: the second is unmatched, with the reason.
    clash = wbfe.compare(a, renamed, metrics="bfe", name_map=[("^layers\\.0\\.(attn|mlp)", "model.layers.0.attn")])
    assert any("already does" in u["reason"] for u in clash.unmatched)
    with pytest.raises(wbfe.InvalidOptionError):
        wbfe.compare(a, b, name_map=["no-equals-sign"])
    with pytest.raises(wbfe.InvalidOptionError):
        wbfe.compare(a, b, name_map=["(unclosed=x"])
    with pytest.raises(wbfe.InvalidOptionError):
        wbfe.compare(a, b, top_k=0)
    with pytest.raises(wbfe.NoUsableMatrixError):
        wbfe.compare(a, {"other.weight": torch.randn(20, 20)})


def test_a_conv1d_checkpoint_against_its_linear_twin_pairs_each_matrix_as_the_model_holds_it(tmp_path: Path) -> None:
    # GPT-2 as transformers stores it (Conv1D: [in, out]) against the same weights stored [out, in] (nanoGPT's
    # Linear): the square c_proj was compared as W against Wᵀ (rel_frobenius 1.4) and the others skipped, "shape differs"
    g = torch.Generator().manual_seed(0)
    conv1d = {"transformer.h.0.attn.c_attn.weight": torch.randn(32, 96, generator=g, dtype=torch.float64),
              "transformer.h.0.attn.c_proj.weight": torch.randn(32, 32, generator=g, dtype=torch.float64),
              "transformer.h.0.mlp.c_fc.weight": torch.randn(32, 128, generator=g, dtype=torch.float64)}
    (tmp_path / "hf").mkdir()
    save_file(conv1d, str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "hf" / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32, "n_layer": 1, "n_head": 2,
        "vocab_size": 50, "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0}))
    change = {k: 0.1 * torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in conv1d.items()}
    save_file({k: (v + change[k]).T.contiguous() for k, v in conv1d.items()}, str(tmp_path / "linear.safetensors"))
    # each matrix out x in (the transpose of the Conv1D's) in the hf folder, and in linear.safetensors
    stored = {"hf": {k: v.numpy().T for k, v in conv1d.items()},
              "linear.safetensors": {k: (v + change[k]).numpy().T for k, v in conv1d.items()}}
    for a, b in (("hf", "linear.safetensors"), ("linear.safetensors", "hf")):
        result = wbfe.compare(tmp_path / a, tmp_path / b, metrics="bfe")
        assert sorted(row["name"] for row in result.layers) == sorted(conv1d) and result.skipped == []
        for row in result.layers:
            x, y = stored[a][row["name"]], stored[b][row["name"]]
            assert row["rel_frobenius"] == pytest.approx(np.linalg.norm(y - x) / np.linalg.norm(x), rel=1e-9)
            assert row["w1_log_eigs"] == pytest.approx(wasserstein_distance(np.log(_eigs(x)), np.log(_eigs(y))),
                                                       rel=1e-6)


def test_a_rename_that_matches_no_name_of_a_is_said() -> None:
    # a --map that renamed nothing (mistyped, or written for B's names) left only unmatched names to guess from
    a, b = _pair(4)
    renamed = {"model." + k: v for k, v in b.items()}
    half = {**renamed, **{k: v for k, v in b.items() if k.startswith("layers.0.")}}  # B holds layers.0 as A names it
    result = wbfe.compare(a, half, metrics="bfe", name_map=["^transformer=model", "^model.layers=layers", "^layers.1=x"])
    assert result.summary["map_note"] == "--map '^transformer=model', '^model.layers=layers' renamed no tensor of A"
    assert "map_note" not in wbfe.compare(a, renamed, metrics="bfe", name_map=["^layers=model.layers"]).summary
    with pytest.raises(wbfe.NoUsableMatrixError, match="; --map '\\^transformer=model' renamed no tensor of A$"):
        wbfe.compare(a, renamed, metrics="bfe", name_map=["^transformer=model"])


def test_shape_change_is_skipped_with_reason() -> None:
    a = {"fc.weight": torch.randn(20, 30), "out.weight": torch.randn(10, 20)}
    b = {"fc.weight": torch.randn(20, 30), "out.weight": torch.randn(12, 20)}
    result = wbfe.compare(a, b, metrics="bfe")
    assert [row["name"] for row in result.layers] == ["fc.weight"]
    assert result.skipped[0]["name"] == "out.weight" and "shape differs" in result.skipped[0]["reason"]
    df = result.to_pandas()
    assert list(df["name"]) == ["fc.weight"] and "d_bfe" in df.columns


def test_cli(tmp_path) -> None:
    a, b = _pair(5)
    save_file({k: v.float().contiguous() for k, v in a.items()}, str(tmp_path / "a.safetensors"))
    save_file({k: v.float().contiguous() for k, v in b.items()}, str(tmp_path / "b.safetensors"))
    runner = CliRunner()
    table = runner.invoke(app, ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"),
                                "--metrics", "bfe", "--top-k", "3"])
    assert table.exit_code == 0, table.output
    assert "most changed" in table.stdout and "layers.1.mlp.weight" in table.stdout
    out = tmp_path / "out"
    done = runner.invoke(app, ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"),
                               "--metrics", "bfe", "--format", "json", "--output", str(out)])
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert data["options"]["top_k"] == 10 and len(data["layers"]) == 4
    assert json.loads((out / "compare.json").read_text())["layers"] == data["layers"]
    assert (out / "compare.csv").read_text().splitlines()[0].startswith("name,")
    assert (out / "change_along_depth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = runner.invoke(app, ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "missing"),
                              "--output", str(tmp_path / "never")])
    assert bad.exit_code == 2 and not (tmp_path / "never").exists()
    bad_map = runner.invoke(app, ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"),
                                  "--map", "x"])
    assert bad_map.exit_code == 2 and "REGEX=REPLACEMENT" in bad_map.stderr


def test_extreme_scales_compare_as_at_scale_one() -> None:
    a, b = _pair(6)
    one = {row["name"]: row for row in wbfe.compare(a, b, metrics="bfe").layers}
    for scale in (1e-200, 1e200):
        small = {row["name"]: row for row in wbfe.compare({k: v * scale for k, v in a.items()},
                                                          {k: v * scale for k, v in b.items()}, metrics="bfe").layers}
        for name, row in one.items():
            for column in ("rel_frobenius", "w1_log_eigs", "stable_rank_delta", "overlap_in", "overlap_out", "d_bfe"):
                assert small[name][column] == pytest.approx(row[column], rel=1e-8, abs=1e-10), (scale, column)
            assert small[name]["frobenius_delta"] == pytest.approx(row["frobenius_delta"] * scale, rel=1e-8)


def test_cli_refuses_an_output_it_cannot_write_before_any_work(tmp_path) -> None:
    a, b = _pair(7)
    save_file({k: v.float().contiguous() for k, v in a.items()}, str(tmp_path / "a.safetensors"))
    (tmp_path / "file").write_text("not a folder")
    out = CliRunner().invoke(app, ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "a.safetensors"),
                                   "--output", str(tmp_path / "file")])
    assert out.exit_code == 2 and "not a folder" in out.stderr


def test_a_model_against_its_fp8_version(tmp_path) -> None:
    # The quantised side is dequantised by wbfe's reader (tested against transformers in test_quant);
    # the change is the quantisation error, computed here from transformers' own FP8 code.
    from types import SimpleNamespace

    from transformers.integrations.finegrained_fp8 import Fp8Quantize, _dequantize_fp8_weight

    quantizer = Fp8Quantize(SimpleNamespace(quantization_config=SimpleNamespace(weight_block_size=[128, 128],
                                                                                scale_fmt=None)))
    g = torch.Generator().manual_seed(8)
    dense = {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(256, 128, generator=g) / 12 for i in range(2)}
    dense["lm_head.weight"] = torch.randn(300, 128, generator=g) / 12
    quantised, reference = {}, {}
    for name, w in dense.items():
        if name.startswith("model.layers"):
            out = quantizer._quantize_one(name, w)
            quantised.update(out)
            reference[name] = _dequantize_fp8_weight(out[name], out[f"{name}_scale_inv"], [128, 128], torch.float64)
        else:
            quantised[name] = w
            reference[name] = w.double()
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    for folder, tensors, cfg in ((tmp_path / "full", dense, {"model_type": "deepseek_v3"}), (tmp_path / "fp8", quantised, config)):
        folder.mkdir()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(cfg))
    result = wbfe.compare(tmp_path / "full", tmp_path / "fp8", metrics="bfe")
    rows = {row["name"]: row for row in result.layers}
    assert set(rows) == set(dense) and not result.unmatched
    for name, w in dense.items():
        x, y = w.double().numpy(), reference[name].numpy()
        assert rows[name]["rel_frobenius"] == pytest.approx(np.linalg.norm(y - x) / np.linalg.norm(x), rel=1e-9)
    assert rows["model.layers.0.mlp.up_proj.weight"]["quant_b"] == "fp8-e4m3-block128"
    assert 1e-3 < rows["model.layers.0.mlp.up_proj.weight"]["rel_frobenius"] < 0.1  # e4m3: 3 mantissa bits
    assert rows["lm_head.weight"]["rel_frobenius"] == 0.0
    consumed = {s["name"]: s for s in result.skipped if s.get("side") == "b"}
    assert consumed["model.layers.1.mlp.up_proj.weight_scale_inv"]["reason"].startswith("consumed: scale of")


def test_compare_refuses_a_layers_pattern_that_score_refuses() -> None:
    """compare() checks --layers as score() does (one options object): a pattern with nested
    unbounded repeats, which can take exponential time on a crafted name, is refused by both."""
    import torch

    from wbfe.errors import InvalidOptionError

    w = {"fc.weight": torch.eye(12)}
    with pytest.raises(InvalidOptionError) as from_score:
        wbfe.score(w, layers="(a+)+$")
    with pytest.raises(InvalidOptionError) as from_compare:
        wbfe.compare(w, w, layers="(a+)+$")
    assert str(from_compare.value) == str(from_score.value)


def test_compare_lists_the_pairs_layers_leaves_out() -> None:
    a, b = _pair()
    result = wbfe.compare(a, b, metrics="bfe", layers=r"\.mlp\.")
    assert {row["name"] for row in result.layers} == {"layers.0.mlp.weight", "layers.1.mlp.weight"}
    left_out = {row["name"] for row in result.skipped if row["reason"] == "not selected by --layers"}
    assert left_out == {"layers.0.attn.weight", "layers.1.conv.weight", "layers.1.norm.weight"}  # before any plan


def test_compare_reports_progress_per_pair() -> None:
    import torch

    a = {f"l{k}.weight": torch.randn(16, 12, generator=torch.Generator().manual_seed(k)) for k in range(3)}
    b = {name: 2 * w for name, w in a.items()}
    seen: list[tuple[int, object, str]] = []
    wbfe.compare(a, b, metrics="bfe", progress=lambda done, total, name: seen.append((done, total, name)))
    assert seen == [(0, 3, ""), (1, 3, "l0.weight"), (2, 3, "l1.weight"), (3, 3, "l2.weight")]


def test_repr_is_one_short_line_and_html_shows_summary_and_top_changed() -> None:
    g = torch.Generator().manual_seed(3)
    a = {f"l{k}.weight": torch.randn(24, 16, generator=g) for k in range(40)}
    b = {name: w * (1 + 0.01 * k) for k, (name, w) in enumerate(a.items())}  # l39 changed most
    c = wbfe.compare(a, b, metrics="bfe")
    text = repr(c)
    assert "\n" not in text and len(text) < 400, len(text)
    assert text.startswith("Comparison(") and "pairs=40" in text and "n_matched=40" in text
    mean = c.summary["rel_frobenius_mean"]
    assert f"rel_frobenius_mean={mean:.6g}" in text
    page = c._repr_html_()
    assert len(page) < 4000 and "<table>" in page and "pairs</th><td>40" in page
    assert page.index("l39.weight") < page.index("l38.weight")  # the most changed first
    assert "l0.weight" not in page  # the top changed only, not every row


def test_compare_holds_about_one_pair_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's own allocation peak (numpy's buffers are traced) while comparing 2 x 60 float32
    matrices of 256 x 256 (30 MiB stored, 60 MiB as float64) stays within a few pairs' float64 work."""
    import tracemalloc

    from safetensors.numpy import save_file

    from wbfe.engine import pipeline

    monkeypatch.setattr(pipeline, "worker_count", lambda device: 1)  # one pair in flight by design

    rng = np.random.default_rng(0)
    a = {f"l{k}.weight": rng.standard_normal((256, 256)).astype(np.float32) for k in range(60)}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file({n: (w * 1.5).astype(np.float32) for n, w in a.items()}, str(tmp_path / "b.safetensors"))
    pair64 = 2 * 256 * 256 * 8  # the largest pair as float64: 1 MiB
    tracemalloc.start()
    try:
        c = wbfe.compare(tmp_path / "a.safetensors", tmp_path / "b.safetensors", metrics="bfe", device="cpu")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert c.summary["n_matched"] == 60
    assert peak < 8 * pair64, peak / 2**20  # holding every tensor would be 30x that


def _folded_int8_twin(seed: int = 0) -> tuple[dict, dict, dict]:
    """A small conv net with BatchNorm (its float state dict), its twin as a converter writes it
    (γ/√(var+ε) folded into each conv's output channels, then every kernel quantised to symmetric
    per-output-channel int8 and dequantised), and each conv's fold factors."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, bias=False), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 24, 3, bias=False), torch.nn.BatchNorm2d(24), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(24, 10))
    g = torch.Generator().manual_seed(seed)
    for bn in (m for m in net if isinstance(m, torch.nn.BatchNorm2d)):  # statistics as training leaves them
        n = bn.num_features
        bn.weight.data = 0.2 + 2.8 * torch.rand(n, generator=g)
        bn.running_var = 0.05 + 4.0 * torch.rand(n, generator=g)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    twin, factors = {}, {}
    for k in (0, 3, 6, 10):
        w = state[f"{k}.weight"].double().numpy()
        if k != 10:
            bn = net[k + 1]
            factor = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().double().numpy()
            factors[f"{k}.weight"] = factor
            w = w * factor.reshape(-1, *[1] * (w.ndim - 1))
        step = np.abs(w.reshape(w.shape[0], -1)).max(axis=1) / 127.0
        step = step.reshape(-1, *[1] * (w.ndim - 1))
        twin[f"{k}.weight"] = torch.from_numpy(np.clip(np.round(w / step), -127, 127) * step).float()
    return state, twin, factors


def _rowscaled_reference(a: np.ndarray, b: np.ndarray) -> tuple[float, np.ndarray]:
    """‖A − diag(s) B‖_F / ‖A‖_F with each s_i from numpy's least squares of row b_i onto a_i."""
    s = np.array([np.linalg.lstsq(b[i][:, None], a[i], rcond=None)[0][0] for i in range(a.shape[0])])
    return float(np.linalg.norm(a - s[:, None] * b) / np.linalg.norm(a)), s


def test_a_folded_quantised_twin_is_folding_not_drift() -> None:
    """Issue 45.5: against its BN-folded int8 twin, a float conv net's raw change is the folded
    factor (large); the change after the per-row least-squares rescaling is the int8 rounding,
    against an independent numpy computation, and the summary says folding was detected."""
    state, twin, factors = _folded_int8_twin()
    result = wbfe.compare(state, twin, metrics="bfe")
    rows = {row["name"]: row for row in result.layers}
    assert set(rows) == {"0.weight", "3.weight", "6.weight", "10.weight"}
    assert {u["name"] for u in result.unmatched} >= {"1.weight", "1.running_var", "10.bias"}
    for name, row in rows.items():
        a = state[name].double().numpy().reshape(state[name].shape[0], -1)
        b = twin[name].double().numpy().reshape(twin[name].shape[0], -1)
        expected, s = _rowscaled_reference(a, b)
        assert row["rel_frobenius_rowscaled"] == pytest.approx(expected, rel=1e-9)
        assert row["row_scale_cv"] == pytest.approx(s.std() / abs(s.mean()), rel=1e-9)
        assert row["rel_frobenius"] == pytest.approx(np.linalg.norm(b - a) / np.linalg.norm(a), rel=1e-9)
        if name in factors:  # folded: the raw change is the factor, the rowscaled one the rounding
            folded = a * factors[name][:, None]
            rounding = np.linalg.norm((folded - b) / factors[name][:, None]) / np.linalg.norm(a)
            assert row["rel_frobenius"] > 0.5
            assert 0.8 * rounding <= row["rel_frobenius_rowscaled"] <= rounding < 0.01
            assert np.corrcoef(s, 1 / factors[name])[0, 1] > 0.9999
        else:  # quantised only: the row scales explain nothing
            assert row["rel_frobenius_rowscaled"] == pytest.approx(row["rel_frobenius"], rel=0.05)
            assert row["rel_frobenius"] < 0.01
    assert result.summary["n_rowscale_explained"] == 3 and result.summary["folding_detected"] is True
    assert "3 of 4 changed pairs" in result.summary["folding_note"]


def test_drift_and_a_uniform_scale_are_not_folding() -> None:
    """Fine-tuning drift leaves the row-scaled change at the raw one; a scale shared by every row
    removes the change but is no fold (the scales do not spread)."""
    a, b = _pair()
    drift = wbfe.compare(a, b, metrics="bfe")
    assert drift.summary["folding_detected"] is False and drift.summary["n_rowscale_explained"] == 0
    for row in drift.layers:
        assert 0.5 * row["rel_frobenius"] < row["rel_frobenius_rowscaled"] <= row["rel_frobenius"]
    doubled = wbfe.compare(a, {k: 2 * v for k, v in a.items()}, metrics="bfe")
    assert doubled.summary["n_rowscale_explained"] == 4 and doubled.summary["folding_detected"] is False
    for row in doubled.layers:
        assert row["rel_frobenius"] == pytest.approx(1.0) and row["rel_frobenius_rowscaled"] < 1e-12
        assert row["row_scale_cv"] < 1e-12


def test_cli_says_when_folding_explains_the_change_and_what_min_eigs_gates(tmp_path: Path) -> None:
    state, twin, _ = _folded_int8_twin()
    save_file({k: v.contiguous() for k, v in state.items() if v.ndim > 0}, str(tmp_path / "float.safetensors"))
    save_file(twin, str(tmp_path / "int8.safetensors"))
    runner = CliRunner()
    table = runner.invoke(app, ["compare", str(tmp_path / "float.safetensors"), str(tmp_path / "int8.safetensors"),
                                "--metrics", "bfe"])
    assert table.exit_code == 0, table.output
    assert "rel_frobenius_rowscaled" in table.stdout
    assert "folding: 3 of 4 changed pairs are a per-output-row rescaling of A" in table.stdout
    text = " ".join(runner.invoke(app, ["compare", "--help"], env={"COLUMNS": "200"}).stdout.split())
    assert "Tail fits (HT-SR, HTMP) need this many eigenvalues" in text and "No pair is dropped for it" in text


def test_rows_are_output_units_whatever_the_stored_layout() -> None:
    """GPT-2's Conv1D stores its weight in × out: a factor per output unit is a row scale of the
    out × in matrix, so the row-scaled change is float32 rounding (on the stored [in, out] array
    reshaped as out × in it would be the whole change)."""
    import copy

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                       bos_token_id=0, eos_token_id=0))
    scaled = copy.deepcopy(model)
    factor = torch.linspace(0.5, 2.0, 128)
    with torch.no_grad():
        scaled.transformer.h[0].mlp.c_fc.weight *= factor[None, :]
    row = next(r for r in wbfe.compare(model, scaled, metrics="bfe").layers if r["name"].endswith("mlp.c_fc.weight"))
    assert (row["shape"], row["rows"], row["cols"]) == ([32, 128], 128, 32)
    assert row["rel_frobenius"] > 0.3 and row["rel_frobenius_rowscaled"] < 1e-6
    s = 1 / factor.double().numpy()
    assert row["row_scale_cv"] == pytest.approx(s.std() / s.mean(), rel=1e-5)


@pytest.mark.parametrize("exponent", [-600, 600])
def test_compare_sides_of_scales_too_far_apart_for_one_factor(exponent: int) -> None:
    # B = A·2^±600 is A with every row rescaled: rowscaled change 0, the scales' spread 0. One common factor for
    # both sides squared one of them out of float64: a ZeroDivisionError above, 1.0 and "no row of B is
    # nonzero" below.
    a = torch.randn(40, 80, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    head = torch.randn(10, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    row = wbfe.compare({"a.weight": a, "h.weight": head}, {"a.weight": a * 2.0**exponent, "h.weight": head}).layers[0]
    assert row["rel_frobenius_rowscaled"] < 1e-15 and row["row_scale_cv"] < 1e-15
    assert row["rel_frobenius"] == pytest.approx(abs(2.0**exponent - 1.0), rel=1e-12)
    assert row["stable_rank_delta"] == pytest.approx(float(a.norm() ** 2 / torch.linalg.matrix_norm(a, 2) ** 2),
                                                     rel=1e-12)


def test_compare_sides_at_opposite_ends_of_float64() -> None:
    # A·2^990 against A·2^-990: one factor for both flushed B to zero, so the subspaces' overlaps were NaN with no
    # reason, and rel_frobenius_rowscaled 1.0 with "no row of B is nonzero" where B is A rescaled.
    a = torch.randn(40, 80, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    head = torch.randn(10, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    row = wbfe.compare({"a.weight": a * 2.0**990, "h.weight": head},
                       {"a.weight": a * 2.0**-990, "h.weight": head}).layers[0]
    assert row["rel_frobenius_rowscaled"] < 1e-15 and row["row_scale_cv"] < 1e-15
    assert row["overlap_in"] == pytest.approx(1.0, abs=1e-12) and row["overlap_out"] == pytest.approx(1.0, abs=1e-12)
    assert row["top_k"] == 10 and row["rel_frobenius"] == 1.0
    assert not {"row_scale_cv", "overlap_in", "overlap_out"} & set(row["reasons"])


@pytest.mark.parametrize("low, high", [(-600, 420), (-700, 700), (-33, 1000)])
def test_compare_a_side_far_below_the_other(low: int, high: int) -> None:
    # A·2^low against A·2^high: ‖B − A‖/‖A‖ = 2^(high − low) − 1, taken on each side's own scale. With one factor for
    # both, A flushed to zero (a ZeroDivisionError at -700, 700) or the ratio overflowed to inf with no reason (-33,
    # 1000); past float64's range it is NaN and says so.
    a = torch.randn(40, 80, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    head = torch.randn(10, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    row = wbfe.compare({"a.weight": a * 2.0**low, "h.weight": head},
                       {"a.weight": a * 2.0**high, "h.weight": head}).layers[0]
    if high - low < 1024:
        assert row["rel_frobenius"] == pytest.approx(2.0 ** (high - low), rel=1e-12)
        assert "rel_frobenius" not in row["reasons"]
    else:
        assert math.isnan(row["rel_frobenius"])
        assert row["reasons"]["rel_frobenius"] == (f"outside float64's range: ‖B − A‖ / ‖A‖ is of order "
                                                   f"1e{(high - low) * math.log10(2.0):.0f}")
    assert row["frobenius_delta"] == pytest.approx(float(a.norm()) * 2.0**high, rel=1e-12)
    assert row["rel_frobenius_rowscaled"] < 1e-15 and row["overlap_in"] == pytest.approx(1.0, abs=1e-12)


def test_the_table_says_why_pairs_were_left_out_by_reason(tmp_path: Path) -> None:
    """The table's footer was '1 unmatched, 3 skipped': a transposed fc.weight, the largest matrix, hid among the
    biases, and a matrix skipped on one side only read as if both were."""
    g = torch.Generator().manual_seed(0)
    a = {"fc.weight": torch.randn(20, 50, generator=g), "fc.bias": torch.zeros(20),
         "mid.weight": torch.randn(30, 20, generator=g), "head.weight": torch.randn(10, 20, generator=g),
         "old.weight": torch.randn(8, 8, generator=g)}
    b = {**a, "fc.weight": a["fc.weight"].T.contiguous(), "head.weight": torch.zeros(10, 20)}
    del b["old.weight"]
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    table = CliRunner().invoke(app, ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"),
                                     "-q"])
    assert table.exit_code == 0, table.output
    assert table.stdout.endswith(
        "\nunmatched 1 tensor: 1 only in A (see --format json for each)\n"
        "skipped 3 pairs: 1 1-D tensor (bias, norm scale or buffer), 1 shape differs, 1 all-zero matrix (B) "
        "(see --format json for each)\n")
