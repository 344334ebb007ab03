"""PEFT LoRA adapters: ΔW = s·B·A spectra from the r × r core, merged modules against peft's own merge."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from typer.testing import CliRunner

import wbfe
from wbfe_cli.main import app

peft = pytest.importorskip("peft", reason="peft is in the [test] extra")


def _write_adapter(folder: Path, tensors: dict, **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **config}))
    return folder


def _dense_eigs(delta: np.ndarray, r: int) -> np.ndarray:
    return np.sort(np.linalg.svd(delta, compute_uv=False)[:r] ** 2)


def _bfe(e: np.ndarray) -> float:
    return 0.5 * (math.log(2 * math.pi) + 1) + 0.5 * (math.log(e.mean()) - np.log(e).mean())


@pytest.mark.parametrize(("r", "alpha", "rslora"), [(4, 8, False), (8, 16, True), (1, 3, False), (16, 5, False)])
def test_spectrum_against_dense_reference(tmp_path, r, alpha, rslora) -> None:
    g = torch.Generator().manual_seed(r)
    shapes = {"model.layers.0.q_proj": (96, 64), "model.layers.0.up_proj": (160, 64), "model.layers.1.down_proj": (64, 160)}
    # rank_pattern / alpha_pattern on one module, as PEFT matches them (suffix after a dot).
    ranks = {name: (r + 2 if name.endswith("up_proj") else r) for name in shapes}
    tensors = {}
    for name, (m, n) in shapes.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(ranks[name], n, generator=g, dtype=torch.float64)
        tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(m, ranks[name], generator=g, dtype=torch.float64)
    folder = _write_adapter(tmp_path / "ad", tensors, r=r, lora_alpha=alpha, use_rslora=rslora,
                            rank_pattern={"layers.0.up_proj": r + 2}, alpha_pattern={"down_proj": 2 * alpha})
    result = wbfe.score(folder, metrics="bfe")
    assert result.model["format"] == "peft-lora" and result.model["adapter"]["r"] == r
    rows = {row["name"]: row for row in result.layers}
    for name in shapes:
        rank = ranks[name]
        a_alpha = 2 * alpha if name.endswith("down_proj") else alpha
        scale = a_alpha / math.sqrt(rank) if rslora else a_alpha / rank
        a = tensors[f"base_model.model.{name}.lora_A.weight"].numpy()
        b = tensors[f"base_model.model.{name}.lora_B.weight"].numpy()
        e = _dense_eigs(scale * b @ a, rank)
        row = rows[f"{name}.weight"]
        assert row["r"] == rank and row["scaling"] == pytest.approx(scale, rel=1e-15)
        np.testing.assert_allclose(row["eigs"], e, rtol=1e-10)
        assert row["frobenius_norm"] == pytest.approx(np.linalg.norm(scale * b @ a), rel=1e-10)
        assert row["spectral_norm"] == pytest.approx(math.sqrt(e[-1]), rel=1e-10)
        assert row["stable_rank"] == pytest.approx(e.sum() / e[-1], rel=1e-10)
        s = np.sqrt(e)
        p = s / s.sum()
        assert row["effective_rank"] == pytest.approx(math.exp(-np.sum(p * np.log(p))), rel=1e-10)
        assert row["bfe"] == pytest.approx(_bfe(e), rel=1e-10)
        assert row["shape"] == list(shapes[name]) and row["n_eigs"] == rank
    summary = result.summary
    assert (summary["n_adapted"], summary["r_min"], summary["r_max"]) == (3, r, r + 2)
    assert summary["largest_update"] == max(rows.values(), key=lambda row: row["frobenius_norm"])["name"]
    assert summary["bfe_mean"] == pytest.approx(np.mean([row["bfe"] for row in rows.values()]), rel=1e-12)


def test_never_a_dense_product(tmp_path) -> None:
    # 200,000 × 150,000 in float64 would be 240 GB: only the r × r core can be behind this.
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 150_000, generator=g)
    b = torch.randn(200_000, 4, generator=g)
    folder = _write_adapter(tmp_path / "big", {"base_model.model.huge.lora_A.weight": a,
                                               "base_model.model.huge.lora_B.weight": b}, r=4, lora_alpha=4)
    row = wbfe.score(folder, metrics="bfe").layers[0]
    # Reference from the 4 × 4 Gram products, independent of the QR route.
    gram = (b.double().T @ b.double()).numpy() @ (a.double() @ a.double().T).numpy()
    np.testing.assert_allclose(row["eigs"], np.sort(np.linalg.eigvals(gram).real), rtol=1e-8)
    assert row["shape"] == [200_000, 150_000]


def test_conv_embedding_and_fan_in_fan_out(tmp_path) -> None:
    g = torch.Generator().manual_seed(1)
    t = {
        "base_model.model.conv.lora_A.weight": torch.randn(3, 5, 3, 3, generator=g),
        "base_model.model.conv.lora_B.weight": torch.randn(12, 3, 1, 1, generator=g),
        "base_model.model.embed_tokens.lora_embedding_A": torch.randn(3, 40, generator=g),
        "base_model.model.embed_tokens.lora_embedding_B": torch.randn(16, 3, generator=g),
        "base_model.model.h.0.attn.c_attn.lora_A.weight": torch.randn(3, 16, generator=g),
        "base_model.model.h.0.attn.c_attn.lora_B.weight": torch.randn(48, 3, generator=g),
    }
    rows = {row["name"]: row for row in wbfe.score(_write_adapter(tmp_path / "ad", t, r=3, lora_alpha=6, fan_in_fan_out=True),
                                                   metrics="bfe").layers}
    conv = t["base_model.model.conv.lora_B.weight"].reshape(12, 3).double() @ t["base_model.model.conv.lora_A.weight"].reshape(3, -1).double()
    np.testing.assert_allclose(rows["conv.weight"]["eigs"], _dense_eigs(2.0 * conv.numpy(), 3), rtol=1e-8)
    assert rows["conv.weight"]["shape"] == [12, 5, 3, 3]
    emb = (t["base_model.model.embed_tokens.lora_embedding_B"].double() @ t["base_model.model.embed_tokens.lora_embedding_A"].double()).T
    np.testing.assert_allclose(rows["embed_tokens.weight"]["eigs"], _dense_eigs(2.0 * emb.numpy(), 3), rtol=1e-8)
    assert rows["embed_tokens.weight"]["shape"] == [40, 16] and rows["embed_tokens.weight"]["role"] == "embedding"
    assert rows["h.0.attn.c_attn.weight"]["shape"] == [16, 48]  # GPT-2 Conv1D stores in × out


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 24)
        self.layers = nn.ModuleList([nn.ModuleDict({"q_proj": nn.Linear(24, 24), "up_proj": nn.Linear(24, 64),
                                                    "down_proj": nn.Linear(64, 24)}) for _ in range(2)])
        self.conv = nn.Conv2d(3, 12, 3)
        self.classifier = nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).mean(1)
        for block in self.layers:
            h = h + block["down_proj"](torch.relu(block["up_proj"](h))) + block["q_proj"](h)
        return self.classifier(h)


@pytest.mark.parametrize("variant", ["plain", "rslora", "patterns", "dora"])
def test_merged_against_peft_merge_and_unload(tmp_path, variant) -> None:
    torch.manual_seed(0)
    model = _Tiny()
    base = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(base, str(tmp_path / "base.safetensors"))
    extra = {"rslora": {"use_rslora": True}, "patterns": {"rank_pattern": {"layers.1.up_proj": 6}, "alpha_pattern": {"q_proj": 3}},
             "dora": {"use_dora": True}, "plain": {}}[variant]
    targets = ["q_proj", "up_proj", "down_proj", "conv", "embed"]
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, modules_to_save=["classifier"],
                             init_lora_weights=False, **extra)
    wrapped = peft.get_peft_model(model, config)
    with torch.no_grad():  # train the saved module too, so that it differs from the base
        wrapped.base_model.model.classifier.modules_to_save["default"].weight.mul_(1.5)
    lora_layers = {name.removeprefix("base_model.model."): m for name, m in wrapped.named_modules()
                   if isinstance(m, peft.tuners.lora.LoraLayer)}
    deltas = {name: m.get_delta_weight("default").detach().double().numpy() for name, m in lora_layers.items()}
    if variant == "dora":  # as trained: magnitudes no longer the norms of W₀ + ΔW they start from
        with torch.no_grad():
            for layer in lora_layers.values():
                vector = layer.lora_magnitude_vector["default"].weight
                vector.mul_(0.5 + torch.rand(vector.shape))
    wrapped.save_pretrained(str(tmp_path / "adapter"))
    merged = {k: v.detach().clone() for k, v in wrapped.merge_and_unload().state_dict().items()}

    result = wbfe.score(tmp_path / "adapter", base=tmp_path / "base.safetensors", metrics="bfe,htsr")
    reference = {row["name"]: row for row in wbfe.score(merged, metrics="bfe,htsr").layers}
    plain_base = {row["name"]: row for row in wbfe.score(base, metrics="bfe,htsr").layers}
    rows = {row["name"]: row for row in result.layers if row["kind"] == "lora"}
    assert set(rows) == {f"{n}.weight" for n in deltas}
    for name, row in rows.items():
        module = name.removesuffix(".weight")
        # ΔW's spectrum against peft's own dense delta (scale, patterns, rsLoRA included).
        np.testing.assert_allclose(row["eigs"], _dense_eigs(deltas[module].reshape(deltas[module].shape[0], -1), row["r"]),
                                   rtol=1e-5)
        # The merged module against peft's merge_and_unload(), scored by wbfe as an ordinary matrix.
        assert row["bfe_merged"] == pytest.approx(reference[name]["bfe"], rel=1e-5)
        assert row["alpha_merged"] == pytest.approx(reference[name]["alpha"], rel=1e-3)
        assert row["bfe_base"] == pytest.approx(plain_base[name]["bfe"], rel=1e-12)
        w0, wm = base[name].double().numpy(), merged[name].double().numpy()
        assert row["rel_frobenius"] == pytest.approx(np.linalg.norm(wm - w0) / np.linalg.norm(w0), rel=1e-5)
        assert row["d_bfe"] == pytest.approx(reference[name]["bfe"] - plain_base[name]["bfe"], rel=1e-4, abs=1e-6)
        if variant == "dora":
            magnitude = lora_layers[module].lora_magnitude_vector["default"].weight.detach().double()
            assert row["dora_magnitude_norm"] == pytest.approx(float(magnitude.norm()), rel=1e-12)
            assert row["dora_magnitude_min"] == pytest.approx(float(magnitude.min()), rel=1e-12)
    saved = [row for row in result.layers if row["kind"] == "modules_to_save"]
    assert [row["name"] for row in saved] == ["classifier.weight"]
    assert saved[0]["bfe"] == pytest.approx(reference["classifier.weight"]["bfe"], rel=1e-12)
    assert any(s["name"] == "classifier.bias" for s in result.skipped)
    assert result.model["base"]["sha256"] is not None and result.model["options"]["base"] == str(tmp_path / "base.safetensors")


def test_trained_adapter(tmp_path) -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 16))
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["0", "2"])
    wrapped = peft.get_peft_model(model, config)
    # Freshly initialised, B = 0: ΔW = 0, reported as such, not as a spectrum.
    wrapped.save_pretrained(str(tmp_path / "untrained"))
    fresh = wbfe.score(tmp_path / "untrained", metrics="bfe").layers
    assert all(row["frobenius_norm"] == 0.0 and math.isnan(row["bfe"]) and "ΔW = 0" in row["reasons"]["bfe"] for row in fresh)
    x, y = torch.randn(256, 16), torch.randn(256, 16)
    optimiser = torch.optim.Adam([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(30):
        optimiser.zero_grad()
        loss = nn.functional.mse_loss(wrapped(x), y)
        loss.backward()
        optimiser.step()
    wrapped.save_pretrained(str(tmp_path / "trained"))
    rows = {row["name"]: row for row in wbfe.score(tmp_path / "trained", metrics="bfe").layers}
    for name in ("0", "2"):
        layer = wrapped.base_model.model[int(name)]
        delta = layer.get_delta_weight("default").detach().double().numpy()
        row = rows[f"{name}.weight"]
        np.testing.assert_allclose(row["eigs"], _dense_eigs(delta, 4), rtol=1e-5)
        assert row["frobenius_norm"] > 0.0 and math.isfinite(row["bfe"]) and 1.0 <= row["stable_rank"] <= 4.0


def test_bad_adapters(tmp_path) -> None:
    g = torch.Generator().manual_seed(2)
    good = {"base_model.model.fc.lora_A.weight": torch.randn(4, 20, generator=g),
            "base_model.model.fc.lora_B.weight": torch.randn(30, 4, generator=g)}
    with pytest.raises(wbfe.CorruptCheckpointError, match="rank_pattern"):
        wbfe.score(_write_adapter(tmp_path / "r", good, r=4, lora_alpha=8, rank_pattern={"fc": 6}))
    with pytest.raises(wbfe.CorruptCheckpointError, match="no lora_B"):
        wbfe.score(_write_adapter(tmp_path / "half", {"base_model.model.fc.lora_A.weight": good["base_model.model.fc.lora_A.weight"]},
                                  r=4, lora_alpha=8))
    with pytest.raises(wbfe.CorruptCheckpointError, match="peft_type"):
        wbfe.score(_write_adapter(tmp_path / "ia3", good, r=4, lora_alpha=8, peft_type="IA3"))
    with pytest.raises(wbfe.CorruptCheckpointError, match="lora_alpha"):
        wbfe.score(_write_adapter(tmp_path / "alpha", good, r=4, lora_alpha=-1))
    folder = _write_adapter(tmp_path / "ok", good, r=4, lora_alpha=8)
    save_file({"fc.weight": torch.randn(20, 30)}, str(tmp_path / "wrong.safetensors"))
    with pytest.raises(wbfe.CorruptCheckpointError, match="not this adapter's base"):
        wbfe.score(folder, base=tmp_path / "wrong.safetensors")
    save_file({"fc.weight": torch.randn(30, 20)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(wbfe.InvalidOptionError, match="--base applies"):
        wbfe.score(tmp_path / "plain.safetensors", base=tmp_path / "plain.safetensors")
    runner = CliRunner()
    out = runner.invoke(app, ["score", str(folder), "--base", str(tmp_path / "plain.safetensors"), "--format", "json",
                              "--metrics", "bfe"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)["layers"][0]
    assert row["name"] == "fc.weight" and row["r"] == 4 and "bfe_merged" in row and "rel_frobenius" in row
    bad = runner.invoke(app, ["score", str(tmp_path / "r"), "--metrics", "bfe"])
    assert bad.exit_code == 2 and "rank_pattern" in bad.stderr
    # use_dora without magnitude vectors: ΔW is scored; the merge, as plain LoRA, would not be the adapted weight.
    dora = wbfe.score(_write_adapter(tmp_path / "dora", good, r=4, lora_alpha=8, use_dora=True),
                      base=tmp_path / "plain.safetensors", metrics="bfe")
    row = dora.layers[0]
    assert math.isfinite(row["bfe"]) and "bfe_merged" not in row  # as for a base weight that cannot be scored
    assert row["reasons"]["merged"].startswith("the adapter config says use_dora, but the module has no")
    # compare reads full checkpoints: an adapter's factors are not the matrices they change.
    with pytest.raises(wbfe.InvalidOptionError, match="LoRA adapter"):
        wbfe.compare(folder, folder)


def test_intra_and_ray_are_refused_for_an_adapter(tmp_path) -> None:
    """With --base, --intra was refused by a second check that said "drop --base", which leaves the adapter folder
    and is refused again: one check now, for an adapter with its base or without."""
    g = torch.Generator().manual_seed(3)
    folder = _write_adapter(tmp_path / "a", {"base_model.model.fc.lora_A.weight": torch.randn(4, 20, generator=g),
                                             "base_model.model.fc.lora_B.weight": torch.randn(30, 4, generator=g)},
                            r=4, lora_alpha=8)
    save_file({"fc.weight": torch.randn(30, 20, generator=g)}, str(tmp_path / "base.safetensors"))
    for base in (None, tmp_path / "base.safetensors"):
        with pytest.raises(wbfe.InvalidOptionError, match="^--intra multiplies a checkpoint's consecutive matrices, "
                                                          "not an adapter's: drop --intra$"):
            wbfe.score(folder, base=base, intra=True)
    with pytest.raises(wbfe.InvalidOptionError, match=r"^--base \(a LoRA adapter\) is scored locally; "
                                                      "drop --executor ray$"):
        wbfe.score(folder, base=tmp_path / "base.safetensors", executor="ray")


def test_what_an_adapter_leaves_out_says_why(tmp_path) -> None:
    g = torch.Generator().manual_seed(5)
    a = torch.randn(4, 20, generator=g, dtype=torch.float64)
    b = torch.randn(30, 4, generator=g, dtype=torch.float64)
    b[:, 3] = 0.0  # ΔW of rank 3: one of its r = 4 singular values is 0
    tensors = {"base_model.model.fc.lora_A.weight": a, "base_model.model.fc.lora_B.weight": b,
               "base_model.model.fc.lora_B.bias": torch.zeros(30)}
    folder = _write_adapter(tmp_path / "ad", tensors, r=4, lora_alpha=8)
    save_file({"other.weight": torch.randn(30, 20)}, str(tmp_path / "other.safetensors"))
    save_file({"fc.weight": torch.ones(30, 20, dtype=torch.int64)}, str(tmp_path / "int.safetensors"))
    result = wbfe.score(folder, metrics="bfe", base=tmp_path / "other.safetensors")
    row = result.layers[0]
    assert row["bfe"] == math.inf and row["reasons"] == {"bfe": "rank-deficient: 1 of the r singular values are 0",
                                                         "merged": "no tensor 'fc.weight' in the base checkpoint"}
    assert result.skipped == [{"name": "base_model.model.fc.lora_B.bias", "shape": [30], "dtype": "float32",
                               "reason": "LoRA tensor other than the factors (e.g. lora_B bias): not a matrix of ΔW"}]
    merged = wbfe.score(folder, metrics="bfe", base=tmp_path / "int.safetensors").layers[0]["reasons"]["merged"]
    assert merged == "base weight: integer tensor (int64): quantized/packed weights or a counter"
    lopsided = _write_adapter(tmp_path / "rank", {"base_model.model.fc.lora_A.weight": a,
                                                  "base_model.model.fc.lora_B.weight": b[:, :3]}, r=4, lora_alpha=8)
    with pytest.raises(wbfe.CorruptCheckpointError, match=r"'fc': lora_A and lora_B disagree on the rank \(4 vs 3\)$"):
        wbfe.score(lopsided)


def test_hub_adapter_from_the_cache(tmp_path, monkeypatch) -> None:
    g = torch.Generator().manual_seed(3)
    tensors = {"base_model.model.fc.lora_A.weight": torch.randn(4, 20, generator=g),
               "base_model.model.fc.lora_B.weight": torch.randn(30, 4, generator=g)}
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-lora"
    _write_adapter(repo / "snapshots" / commit, tensors, r=4, lora_alpha=8)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    hub = wbfe.score("someone/tiny-lora", metrics="bfe")
    local = wbfe.score(repo / "snapshots" / commit, metrics="bfe")
    assert hub.model["format"] == "peft-lora" and hub.model["commit"] == commit
    assert hub.layers[0]["eigs"] == local.layers[0]["eigs"] and hub.layers[0]["r"] == 4


def test_merge_onto_an_fp8_base_reads_it_dequantised(tmp_path) -> None:
    """The merge streams the base as `wbfe score` reads it: an FP8 block-quantised weight is merged
    as its dequantised float matrix (it used to fail: the merge read the raw FP8 entries), and the
    merged spectrum equals that of W₀(dequantised) + ΔW scored as an ordinary matrix."""
    from types import SimpleNamespace

    from transformers.integrations.finegrained_fp8 import Fp8Quantize, _dequantize_fp8_weight

    g = torch.Generator().manual_seed(5)
    quantizer = Fp8Quantize(SimpleNamespace(quantization_config=SimpleNamespace(weight_block_size=[128, 128],
                                                                                scale_fmt=None)))
    w = torch.randn(256, 384, generator=g) / 20
    base_tensors = quantizer._quantize_one("model.layers.0.mlp.up_proj.weight", w)
    w0 = _dequantize_fp8_weight(base_tensors["model.layers.0.mlp.up_proj.weight"],
                                base_tensors["model.layers.0.mlp.up_proj.weight_scale_inv"], [128, 128], torch.float64)
    base = tmp_path / "base"
    base.mkdir()
    save_file(base_tensors, str(base / "model.safetensors"))
    (base / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}))
    a = torch.randn(4, 384, generator=g) / 10
    b = torch.randn(256, 4, generator=g) / 10
    adapter = _write_adapter(tmp_path / "adapter", {
        "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": a,
        "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight": b}, r=4, lora_alpha=8)
    result = wbfe.score(adapter, base=base, metrics="bfe")
    row = next(r for r in result.layers if r["name"] == "model.layers.0.mlp.up_proj.weight")
    merged = w0 + 2.0 * (b.double() @ a.double())  # scaling = lora_alpha / r
    reference = wbfe.score({"model.layers.0.mlp.up_proj.weight": merged}, metrics="bfe").layers[0]["bfe"]
    assert "merged" not in row["reasons"], row["reasons"]
    assert row["bfe_merged"] == pytest.approx(reference, rel=1e-10)
    assert row["bfe_base"] == pytest.approx(wbfe.score({"w.weight": w0}, metrics="bfe").layers[0]["bfe"], rel=1e-12)


def test_the_table_shows_the_merged_columns_in_the_models_order(tmp_path) -> None:
    """``score ADAPTER --base BASE`` prints bfe_base, bfe_merged, d_bfe and rel_frobenius per module (the
    JSON's values), with the rows in the base model's own order (q, k, v, o, gate, up, down: the order
    transformers' named_parameters() gives), not the adapter file's sorted names; an untrained adapter
    prints no largest update."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(4)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path / "base")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    want = [n for n, _ in model.named_parameters() if any(f"{t}." in n for t in targets)]  # before peft wraps them
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    wrapped.save_pretrained(str(tmp_path / "untrained"))
    untrained = CliRunner().invoke(app, ["score", str(tmp_path / "untrained"), "--metrics", "bfe"])
    assert untrained.exit_code == 0, untrained.output
    assert "largest_update" not in untrained.stdout and "untrained" in untrained.stdout
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    wrapped.save_pretrained(str(tmp_path / "adapter"))

    argv = ["score", str(tmp_path / "adapter"), "--base", str(tmp_path / "base"), "--metrics", "bfe"]
    shown = CliRunner().invoke(app, argv)
    as_json = CliRunner().invoke(app, [*argv, "--format", "json"])
    assert shown.exit_code == 0 and as_json.exit_code == 0, shown.output
    layers = json.loads(as_json.stdout)["layers"]
    assert [row["name"] for row in layers] == want
    lines = shown.stdout.splitlines()
    header = next(line for line in lines if line.startswith("name"))
    columns = header.split()
    assert {"bfe_base", "bfe_merged", "d_bfe", "rel_frobenius"} <= set(columns)
    printed = [line.split() for line in lines if line.split()[:1] and line.split()[0] in want]
    assert [cells[0] for cells in printed] == want
    from wbfe.render.text import format_value

    for cells, row in zip(printed, layers):
        for column in ("bfe_base", "bfe_merged", "d_bfe", "rel_frobenius"):
            assert cells[columns.index(column)] == format_value(row[column]), (row["name"], column)
    assert "largest_update " in shown.stdout


def test_factors_out_of_range_give_nan_columns_with_their_reason(tmp_path) -> None:
    # A NaN factor made numpy's SVD raise LinAlgError; factors near 1e300 gave an inf norm and NaN columns, no reason.
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 32, generator=g, dtype=torch.float64), torch.randn(64, 4, generator=g, dtype=torch.float64)
    nan = a.clone()
    nan[1, 2] = math.nan
    cases = {"nan": (nan, ("stable_rank", "effective_rank", "bfe", "lambda", "frobenius_norm", "spectral_norm"),
                     "ΔW's singular values are not finite (NaN or Inf in lora_A or lora_B, or B·A past float64's range)"),
             "huge": (a * 1e300, ("stable_rank", "effective_rank", "bfe", "lambda", "frobenius_norm"), None)}
    for label, (factor, columns, why) in cases.items():
        folder = _write_adapter(tmp_path / label, {"base_model.model.fc.lora_A.weight": factor,
                                                   "base_model.model.fc.lora_B.weight": b}, r=4, lora_alpha=8)
        row = wbfe.score(folder, metrics="bfe").layers[0]
        assert all(math.isnan(row[c]) for c in columns), label
        if why is None:  # the spectral norm is still exact: 2·‖B·A‖₂
            top = np.linalg.svd(2.0 * (b.numpy() @ (a.numpy() * 1e300)), compute_uv=False)[0]
            assert row["spectral_norm"] == pytest.approx(top, rel=1e-10)
            why = f"ΔW's singular values (up to {top:.3g}) square past float64's range"
        assert row["reasons"] == dict.fromkeys(columns, why), label


def test_refusals_name_what_was_read(tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    folder = _write_adapter(tmp_path / "ad", {"base_model.model.fc.lora_A.weight": torch.randn(4, 32, generator=g),
                                              "base_model.model.fc.lora_B.weight": torch.randn(64, 4, generator=g)},
                            r=4, lora_alpha=8)
    # A base given as a state dict: the message held every value of its tensors.
    with pytest.raises(wbfe.CorruptCheckpointError) as caught:
        wbfe.score(folder, base={"fc.weight": torch.randn(10, 10)})
    assert str(caught.value) == ("<dict>: fc.weight has shape [10, 10] but the adapter's ΔW is [64, 32]: "
                                 "not this adapter's base model")
    # ... and its options named it by the repr of every tensor value
    merged = wbfe.score(folder, metrics="bfe", base={"fc.weight": torch.randn(64, 32, generator=g)})
    assert merged.model["options"]["base"] == merged.model["base"]["source"] == "<dict>"
    # --layers that selects no module: it said the adapter held no LoRA module.
    with pytest.raises(wbfe.NoUsableMatrixError, match=r"nothing scored \(1 tensor\(s\) left out: not selected by "
                                                       r"--layers\)$"):
        wbfe.score(folder, layers="attn")


@pytest.mark.parametrize("config, message", [
    ("{not json", r"not a readable JSON adapter config \(Expecting property name"),
    ("[1, 2]", "the adapter config is not a JSON object"),
    ({"r": 0.5, "lora_alpha": 8}, "r must be a positive integer, not 0.5"),
    ({"r": 4, "lora_alpha": 8, "rank_pattern": [["fc", 2]]},
     "rank_pattern must map module patterns to values, not a list"),
    ({"r": 4, "lora_alpha": 8, "use_rslora": "yes"}, "use_rslora must be true or false, not 'yes'"),
    ({"r": 4, "lora_alpha": 8, "alpha_pattern": {"fc(": 2}}, r"pattern 'fc\(' is not a regular expression"),
    ({"r": 4, "lora_alpha": 8, "modules_to_save": "fc"}, "modules_to_save must be a list of module names"),
])
def test_an_adapter_config_that_peft_could_not_load_is_refused_saying_why(tmp_path: Path, config: object,
                                                                          message: str) -> None:
    folder = tmp_path / "adapter"
    folder.mkdir()
    save_file({"base_model.model.fc.lora_A.weight": torch.ones(4, 20)}, str(folder / "adapter_model.safetensors"))
    text = config if isinstance(config, str) else json.dumps({"peft_type": "LORA", **config})  # type: ignore[dict-item]
    (folder / "adapter_config.json").write_text(text)
    with pytest.raises(wbfe.CorruptCheckpointError, match=message):
        wbfe.score(folder)


def test_an_adapter_config_without_its_weights_is_refused_saying_so(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    with pytest.raises(wbfe.SourceNotFoundError, match="adapter_config.json but no adapter_model.safetensors or "):
        wbfe.score(tmp_path)


@pytest.mark.parametrize(("part", "shape"), [("lora_A", ()), ("lora_A", (4,)), ("lora_A", (0, 20)), ("lora_A", (4, 0)),
                                             ("lora_B", (0, 4)), ("lora_embedding_A", (4,))])
def test_a_lora_factor_that_is_no_matrix_is_refused_in_one_line(tmp_path: Path, part: str, shape: tuple) -> None:
    """A 0-D factor raised IndexError, an empty one ValueError, and a 1-D lora_A (4,) was read as a column: the
    module scored as a [30, 1] ΔW. ΔW = B·A of factors that are not matrices has no meaning: refused, naming it."""
    g = torch.Generator().manual_seed(5)
    tensors = {"base_model.model.fc.lora_A.weight": torch.randn(4, 20, generator=g),
               "base_model.model.fc.lora_B.weight": torch.randn(30, 4, generator=g)}
    name = "base_model.model.emb.lora_embedding_A" if part.startswith("lora_embedding") else \
        f"base_model.model.fc.{part}.weight"
    tensors[name] = torch.zeros(shape) if 0 in shape else torch.randn(shape, generator=g)
    folder = _write_adapter(tmp_path / "bad", tensors, r=4, lora_alpha=8)
    with pytest.raises(wbfe.CorruptCheckpointError) as info:
        wbfe.score(folder, metrics="bfe")
    assert str(info.value) == (f"{folder}: LoRA factor {name!r} of shape {list(shape)}: a factor is a matrix with at "
                               "least one entry")
    out = CliRunner().invoke(app, ["score", str(folder), "--metrics", "bfe"])
    assert out.exit_code == 2 and out.stderr.count("\n") == 1, out.output


def test_an_adapter_with_a_bias_and_a_counter_saved_whole_scores_its_modules(tmp_path) -> None:
    """Tensors saved whole beside the LoRA modules that hold no matrix (a classifier bias, a step counter) are
    listed as skipped with the engine's reasons; the modules are scored as without them (the whole adapter was
    refused: 'no usable weight matrix'). An adapter with nothing to score is refused naming the folder."""
    g = torch.Generator().manual_seed(0)
    factors = {"base_model.model.fc.lora_A.weight": torch.randn(4, 20, generator=g),
               "base_model.model.fc.lora_B.weight": torch.randn(30, 4, generator=g)}
    plain = wbfe.score(_write_adapter(tmp_path / "plain", dict(factors), r=4, lora_alpha=8), metrics="bfe")
    extra = {**factors, "base_model.model.classifier.bias": torch.randn(30, generator=g), "step": torch.tensor(5)}
    scored = wbfe.score(_write_adapter(tmp_path / "extra", extra, r=4, lora_alpha=8), metrics="bfe")
    assert scored.layers == plain.layers and scored.summary == plain.summary
    assert scored.skipped == [
        {"name": "classifier.bias", "reason": "1-D tensor (bias, norm scale or buffer)", "shape": [30],
         "dtype": "float32"},
        {"name": "step", "reason": "integer tensor (int64): quantized/packed weights or a counter", "shape": [],
         "dtype": "int64"}]
    lonely = _write_adapter(tmp_path / "lonely", {"step": torch.tensor(5)}, r=4, lora_alpha=8)
    with pytest.raises(wbfe.NoUsableMatrixError, match=f"^{lonely}: nothing scored \\(1 tensor\\(s\\) left out: "):
        wbfe.score(lonely)


def test_a_factor_saved_twice_is_refused_naming_both(tmp_path) -> None:
    """A module's lora_A saved with and without ``base_model.model.``: two factors for one place, refused naming
    both (the later silently replaced the earlier)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 20, generator=g), torch.randn(30, 4, generator=g)
    folder = _write_adapter(tmp_path / "twice", {"base_model.model.fc.lora_A.weight": a, "fc.lora_A.weight": 2 * a,
                                                 "base_model.model.fc.lora_B.weight": b}, r=4, lora_alpha=8)
    with pytest.raises(wbfe.CorruptCheckpointError, match=(
            f"^{folder}: module 'fc' is stored twice: base_model.model.fc.lora_A.weight and fc.lora_A.weight$")):
        wbfe.score(folder)


def test_intra_with_a_base_is_refused_before_either_is_opened(tmp_path) -> None:
    """Only an adapter takes --base, so --intra with --base is refused before anything is read: the adapter was
    opened (downloaded, were it remote) first, and a missing one was refused as missing instead."""
    line = "--intra multiplies a checkpoint's consecutive matrices, not an adapter's: drop --intra"
    with pytest.raises(wbfe.InvalidOptionError) as info:
        wbfe.score(tmp_path / "no-adapter", base=tmp_path / "no-base", intra=True)
    assert str(info.value) == line
    out = CliRunner().invoke(app, ["score", str(tmp_path / "no-adapter"), "--base", str(tmp_path / "no-base"),
                                   "--intra"])
    assert out.exit_code == 2 and out.stderr == f"wbfe: error: {line}\n", out.output


def test_the_bfe_of_delta_w_is_the_bfe_groups_and_takes_lambda(tmp_path) -> None:
    """ΔW's ``bfe`` and ``lambda`` were computed whatever --metrics, while --lambda without bfe in --metrics was
    refused as read by nothing: now they are the bfe group's columns, there with it (at --lambda) and not without."""
    g = torch.Generator().manual_seed(7)
    a = torch.randn(4, 20, generator=g, dtype=torch.float64)
    b = torch.randn(30, 4, generator=g, dtype=torch.float64)
    folder = _write_adapter(tmp_path / "ad", {"base_model.model.fc.lora_A.weight": a,
                                              "base_model.model.fc.lora_B.weight": b}, r=4, lora_alpha=8)
    e = _dense_eigs(2.0 * b.numpy() @ a.numpy(), 4)
    at_half = 0.5 * 0.5 * e.mean() - 0.5 * np.log(e).mean() + 0.5 * math.log(2 * math.pi / 0.5)
    row = wbfe.score(folder, metrics="bfe,htsr", lam=0.5).layers[0]
    assert row["lambda"] == 0.5 and row["bfe"] == pytest.approx(at_half, rel=1e-10)
    plain = wbfe.score(folder, metrics="htsr")
    assert "bfe" not in plain.layers[0] and "lambda" not in plain.layers[0] and "bfe_mean" not in plain.summary
    assert plain.layers[0]["stable_rank"] == pytest.approx(e.sum() / e[-1], rel=1e-10)
    line = ("--lambda 0.5 is read by the bfe and htmp metrics, which --metrics htsr leaves out: add bfe to --metrics "
            "or drop --lambda")
    with pytest.raises(wbfe.InvalidOptionError) as info:
        wbfe.score(folder, metrics="htsr", lam=0.5)
    assert str(info.value) == line
    runner = CliRunner()
    out = runner.invoke(app, ["score", str(folder), "--metrics", "htsr", "--lambda", "0.5"])
    assert out.exit_code == 2 and out.stderr == f"wbfe: error: {line}\n", out.output
    table = runner.invoke(app, ["score", str(folder), "--metrics", "htsr"])
    assert table.exit_code == 0 and table.stdout.splitlines()[2].split() == ["name", "role", "shape", "form",
                                                                              "stable_rank"], table.output
    shown = json.loads(runner.invoke(app, ["score", str(folder), "--metrics", "bfe", "--lambda", "0.5",
                                           "--format", "json"]).stdout)["layers"][0]
    assert shown["lambda"] == 0.5 and shown["bfe"] == pytest.approx(at_half, rel=1e-10)


def test_delta_w_bfe_is_not_computed_when_metrics_leaves_bfe_out(tmp_path, monkeypatch) -> None:
    """ΔW's bfe was computed and then dropped under --metrics without bfe: now it is never computed (BFE-W
    refuses to run here), and the row, trained or as PEFT initialises it (B = 0), is the same as before."""
    g = torch.Generator().manual_seed(11)
    a = torch.randn(4, 20, generator=g, dtype=torch.float64)
    b = torch.randn(30, 4, generator=g, dtype=torch.float64)
    folder = _write_adapter(tmp_path / "ad", {"base_model.model.fc.lora_A.weight": a,
                                              "base_model.model.fc.lora_B.weight": b,
                                              "base_model.model.out.lora_A.weight": a.clone(),
                                              "base_model.model.out.lora_B.weight": torch.zeros_like(b)},
                            r=4, lora_alpha=8)
    e = _dense_eigs(2.0 * b.numpy() @ a.numpy(), 4)

    def refuse(*args, **kwargs):
        raise AssertionError("bfe computed though --metrics leaves it out")

    monkeypatch.setattr("wbfe.adapters.bfe", refuse)
    rows = {row["name"]: row for row in wbfe.score(folder, metrics="htsr").layers}
    assert rows["fc.weight"]["stable_rank"] == pytest.approx(e.sum() / e[-1], rel=1e-10)
    assert "bfe" not in rows["fc.weight"] and rows["fc.weight"]["reasons"] == {}
    why = "ΔW = 0: B (or A) is all zero, as PEFT initialises it (an untrained adapter)"
    assert rows["out.weight"]["reasons"] == {"stable_rank": why, "effective_rank": why}
    assert "bfe" not in rows["out.weight"] and "lambda" not in rows["out.weight"]


def test_what_the_reader_leaves_out_of_an_adapter_keeps_its_reason(tmp_path) -> None:
    """An adapter's tensors were read again as a state dict without the reader's skip: a tensor of a second state
    dict was scored as saved whole, a factor there refused as 'has no lora_B factor', and a stride-0 factor
    materialised; each is now listed with the reader's reason, or refused saying it."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(4, 20, generator=g), torch.randn(30, 4, generator=g)
    folder = tmp_path / "ema"
    folder.mkdir()
    torch.save({"state_dict": {"base_model.model.fc.lora_A.weight": a, "base_model.model.fc.lora_B.weight": b,
                               "base_model.model.out.weight": torch.ones(1).expand(30, 20)},
                "ema": {"base_model.model.fc.lora_A.weight": a, "head.weight": torch.randn(30, 20, generator=g)}},
               folder / "adapter_model.bin")
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    result = wbfe.score(folder, metrics="bfe")
    why = "in 'ema', not the state dict scored ('state_dict'); score checkpoint['ema'] for it"
    assert [row["name"] for row in result.layers] == ["fc.weight"]
    assert result.skipped == [
        {"name": "out.weight", "reason": "stride-0 (expanded) storage: its 600 elements view 4 bytes of storage; not "
                                         "materialised", "shape": [30, 20], "dtype": "float32"},
        {"name": "ema/base_model.model.fc.lora_A.weight", "reason": why, "shape": [4, 20], "dtype": "float32"},
        {"name": "ema/head.weight", "reason": why, "shape": [30, 20], "dtype": "float32"}]
    broadcast = tmp_path / "broadcast"
    broadcast.mkdir()
    torch.save({"base_model.model.fc.lora_A.weight": torch.ones(1).expand(4, 20),
                "base_model.model.fc.lora_B.weight": b},
               broadcast / "adapter_model.bin")
    (broadcast / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    with pytest.raises(wbfe.CorruptCheckpointError) as info:
        wbfe.score(broadcast, metrics="bfe")
    assert str(info.value) == (f"{broadcast}: module 'fc': its lora_A factor cannot be read (stride-0 (expanded) "
                               "storage: its 80 elements view 4 bytes of storage; not materialised)")
