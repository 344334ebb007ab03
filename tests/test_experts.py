"""Fused MoE experts: the same random weights stored per expert (2-D) and fused (3-D, Qwen and gpt-oss
layouts, and gpt-oss's MXFP4) give the same rows and numbers; bias stacks are biases; per-role means."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import wbfe

E, H, I, LAYERS = 4, 32, 24, 2
_NUMERIC = ("rows", "cols", "n_eigs", "gamma", "lambda", "bfe", "alpha", "log_norm", "stable_rank", "entropy")


def _experts(seed: int = 0) -> dict[tuple[int, int, str], torch.Tensor]:
    """(layer, expert, proj) -> [out, in] float64 weights, PyTorch orientation."""
    g = torch.Generator().manual_seed(seed)
    out: dict[tuple[int, int, str], torch.Tensor] = {}
    for layer in range(LAYERS):
        for e in range(E):
            out[layer, e, "gate_proj"] = torch.randn(I, H, generator=g, dtype=torch.float64) / math.sqrt(H)
            out[layer, e, "up_proj"] = torch.randn(I, H, generator=g, dtype=torch.float64) / math.sqrt(H)
            out[layer, e, "down_proj"] = torch.randn(H, I, generator=g, dtype=torch.float64) / math.sqrt(I)
    return out


def _common(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {"model.embed_tokens.weight": torch.randn(64, H, generator=g, dtype=torch.float64),
             "lm_head.weight": torch.randn(64, H, generator=g, dtype=torch.float64) / math.sqrt(H)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}"
        state[f"{p}.self_attn.q_proj.weight"] = torch.randn(H, H, generator=g, dtype=torch.float64) / math.sqrt(H)
        state[f"{p}.mlp.gate.weight"] = torch.randn(E, H, generator=g, dtype=torch.float64)
        state[f"{p}.mlp.shared_expert.up_proj.weight"] = torch.randn(I, H, generator=g, dtype=torch.float64)
    return state


def _per_expert(w: dict) -> dict[str, torch.Tensor]:
    return {f"model.layers.{l}.mlp.experts.{e}.{proj}.weight": t for (l, e, proj), t in w.items()}


def _fused(w: dict, layout: str) -> dict[str, torch.Tensor]:
    state = {}
    for layer in range(LAYERS):
        gate = torch.stack([w[layer, e, "gate_proj"] for e in range(E)])  # [E, I, H]
        up = torch.stack([w[layer, e, "up_proj"] for e in range(E)])
        down = torch.stack([w[layer, e, "down_proj"] for e in range(E)])  # [E, H, I]
        p = f"model.layers.{layer}.mlp.experts"
        if layout == "qwen":  # [E, 2I, H] = [gate; up], down [E, H, I]
            state[f"{p}.gate_up_proj"] = torch.cat([gate, up], dim=1)
            state[f"{p}.down_proj"] = down
        else:  # gpt-oss: [E, H, 2I] with gate and up interleaved, down [E, I, H]
            state[f"{p}.gate_up_proj"] = torch.stack([gate, up], dim=2).reshape(E, 2 * I, H).transpose(1, 2)
            state[f"{p}.down_proj"] = down.transpose(1, 2)
            state[f"{p}.gate_up_proj_bias"] = torch.zeros(E, 2 * I, dtype=torch.float64)
            state[f"{p}.down_proj_bias"] = torch.zeros(E, H, dtype=torch.float64)
    return state


def _save(folder: Path, state: dict[str, torch.Tensor], model_type: str) -> Path:
    from safetensors.torch import save_file

    folder.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    config = {"architectures": ["X"], "model_type": model_type, "hidden_size": H, "num_experts": E,
              "moe_intermediate_size": I, "vocab_size": 64, "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _key(name: str) -> tuple[int, int, str]:
    per = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.weight$", name)
    if per:
        return int(per.group(1)), int(per.group(2)), per.group(3)
    fused = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)\[(\d+)\](?:\.(gate|up))?$", name)
    assert fused, name
    proj = "down_proj" if fused.group(2) == "down_proj" else f"{fused.group(4)}_proj"
    return int(fused.group(1)), int(fused.group(3)), proj


def _expert_rows(result: wbfe.ModelScore) -> dict[tuple[int, int, str], dict]:
    return {_key(r["name"]): r for r in result.layers if r["role"] == "expert"}


@pytest.mark.parametrize("layout,model_type", [("qwen", "qwen3_moe"), ("gpt-oss", "gpt_oss")])
def test_fused_experts_score_as_the_per_expert_matrices(tmp_path: Path, layout: str, model_type: str) -> None:
    w = _experts()
    per = wbfe.score(_save(tmp_path / "per", _common() | _per_expert(w), model_type), metrics="bfe,htsr")
    fused = wbfe.score(_save(tmp_path / "fused", _common() | _fused(w, layout), model_type), metrics="bfe,htsr")
    a, b = _expert_rows(per), _expert_rows(fused)
    assert len(a) == LAYERS * E * 3 and a.keys() == b.keys()
    for key in a:
        for column in _NUMERIC:
            x, y = a[key][column], b[key][column]
            assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-12, abs=1e-12), (key, column)
    others = lambda r: {x["name"]: x["bfe"] for x in r.layers if x["role"] != "expert"}  # noqa: E731
    assert others(per) == others(fused)
    assert per.summary["by_role"]["expert"]["bfe_mean"] == pytest.approx(fused.summary["by_role"]["expert"]["bfe_mean"],
                                                                        rel=1e-12)
    if layout == "gpt-oss":
        reasons = {s["name"]: s["reason"] for s in fused.skipped}
        assert reasons["model.layers.0.mlp.experts.gate_up_proj_bias"].startswith("bias")
    # The head is the LM head, not a router (whose E outputs feed no matrix either).
    assert fused.summary["head"] == "lm_head.weight"


def test_per_role_means(tmp_path: Path) -> None:
    result = wbfe.score(_save(tmp_path / "m", _common() | _fused(_experts(), "qwen"), "qwen3_moe"), metrics="bfe")
    by_role = result.summary["by_role"]
    assert set(by_role) == {"embedding", "head", "attention", "router", "shared_expert", "expert"}
    for role, stats in by_role.items():
        values = [r["bfe"] for r in result.layers if r["role"] == role]
        assert stats["n"] == len(values) and stats["bfe_mean"] == pytest.approx(float(np.mean(values)), rel=1e-12)
    assert by_role["expert"]["n"] == LAYERS * E * 3


def test_unknown_model_type_scores_gate_up_unsplit_with_a_note(tmp_path: Path) -> None:
    result = wbfe.score(_save(tmp_path / "m", _common() | _fused(_experts(), "qwen"), "some_new_moe"), metrics="bfe")
    names = [r["name"] for r in result.layers if r["role"] == "expert"]
    assert "model.layers.0.mlp.experts.gate_up_proj[3]" in names and len(names) == LAYERS * E * 2
    row = next(r for r in result.layers if r["name"] == "model.layers.0.mlp.experts.gate_up_proj[3]")
    assert (row["rows"], row["cols"]) == (2 * I, H)
    assert "unsplit" in result.summary["experts_note"]


def test_conv1d_kernels_keep_the_flatten_convention() -> None:
    g = torch.Generator().manual_seed(0)
    state = {"encoder.conv.weight": torch.randn(16, 8, 5, generator=g), "fc.weight": torch.randn(4, 16, generator=g)}
    row = next(r for r in wbfe.score(state, metrics="bfe").layers if r["name"] == "encoder.conv.weight")
    assert (row["convention"], row["rows"], row["cols"]) == ("flatten", 16, 40)


def test_gpt_oss_mxfp4_checkpoint_scores_from_the_cli(tmp_path: Path) -> None:
    """gpt-oss's layout: MXFP4 expert blocks + scales, bf16 bias stacks and attention, router."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import _convert_moe_packed_tensors
    from wbfe_cli.main import app

    g = torch.Generator().manual_seed(7)
    hidden, inter = 64, 32  # MXFP4 blocks hold 32 values of a row
    state: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(100, hidden, generator=g).bfloat16(),
                                      "lm_head.weight": torch.randn(100, hidden, generator=g).bfloat16()}
    reference: dict[str, torch.Tensor] = {}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}.mlp.experts"
        state[f"model.layers.{layer}.mlp.router.weight"] = torch.randn(E, hidden, generator=g).bfloat16()
        state[f"model.layers.{layer}.self_attn.q_proj.weight"] = torch.randn(hidden, hidden, generator=g).bfloat16()
        for proj, (rows, cols) in (("gate_up_proj", (2 * inter, hidden)), ("down_proj", (hidden, inter))):
            blocks = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, dtype=torch.int32).to(torch.uint8)
            scales = torch.randint(120, 130, (E, rows, cols // 32), generator=g, dtype=torch.int32).to(torch.uint8)
            state[f"{p}.{proj}_blocks"], state[f"{p}.{proj}_scales"] = blocks, scales
            state[f"{p}.{proj}_bias"] = torch.zeros(E, rows, dtype=torch.bfloat16)
            reference[f"{p}.{proj}"] = _convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).double()
    config = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": hidden,
              "num_local_experts": E, "intermediate_size": inter, "vocab_size": 100, "tie_word_embeddings": False,
              "quantization_config": {"quant_method": "mxfp4"}}
    folder = tmp_path / "gpt-oss"
    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    out = CliRunner().invoke(app, ["score", str(folder), "--metrics", "bfe", "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    seen = {r["name"] for r in data["layers"]} | {s["name"] for s in data["skipped"]}
    assert set(state) <= seen
    reasons = {s["name"]: s["reason"] for s in data["skipped"]}
    assert reasons["model.layers.0.mlp.experts.down_proj_scales"].startswith("consumed: E8M0 scales")
    assert reasons["model.layers.0.mlp.experts.down_proj_bias"].startswith("bias")
    rows = {r["name"]: r for r in data["layers"]}
    for name, full in reference.items():  # [E, in, out], gate/up interleaved along out
        for e in range(E):
            matrix = full[e].T
            parts = {"gate": matrix[0::2], "up": matrix[1::2]} if "gate_up" in name else {"": matrix}
            for part, m in parts.items():
                row = rows[f"{name}[{e}]" + (f".{part}" if part else "")]
                s = torch.linalg.svdvals(m).numpy() ** 2
                from wbfe.metrics.bfe import bfe_from_moments

                assert row["quant"] == "mxfp4" and [row["rows"], row["cols"]] == list(m.shape)
                assert row["bfe"] == pytest.approx(bfe_from_moments(s.mean(), np.log(s).mean(), "opt")[0], rel=1e-9)
    assert data["summary"]["head"] == "lm_head.weight" and data["summary"]["head_source"] == "framework"


def test_qwen_style_fused_moe_scores_from_the_cli(tmp_path: Path) -> None:
    from wbfe_cli.main import app

    state = _common() | _fused(_experts(), "qwen")
    folder = _save(tmp_path / "qwen", state, "qwen3_moe")
    out = CliRunner().invoke(app, ["score", str(folder), "--metrics", "bfe", "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    rows = {r["name"] for r in data["layers"]}
    for name in state:
        assert name in rows or any(r.startswith(f"{name}[") for r in rows), name
    assert sum(r.startswith("model.layers.1.mlp.experts.gate_up_proj[") for r in rows) == 2 * E
    assert data["skipped"] == [] and data["summary"]["by_role"]["expert"]["n"] == LAYERS * E * 3


def test_gguf_expert_stacks_and_router_names() -> None:
    from wbfe.engine.experts import is_expert_stack
    from wbfe.engine.matrices import role_of

    assert is_expert_stack("blk.0.ffn_gate_exps.weight", (8, 64, 32))
    assert not is_expert_stack("blk.0.conv.weight", (8, 64, 3))
    assert role_of("blk.0.ffn_down_exps.weight[3]", 2) == "expert"
    assert role_of("blk.0.ffn_gate_inp.weight", 2) == "router"
    assert role_of("model.layers.0.mlp.gate.weight", 2) == "router"
    assert role_of("model.layers.0.mlp.gate_proj.weight", 2) == "mlp"


def test_esd_rereads_see_expert_rows_as_score_does(tmp_path: Path) -> None:
    """The report's ESD thumbnails and `wbfe esd` re-read a matrix by its row name: for a fused
    stack that is `<tensor>[e]`, which only exists once the stack is split as score() splits it."""
    from wbfe.reporting.model import read_eigenvalues
    from wbfe.scoring import layer_spectrum

    folder = _save(tmp_path / "fused", _common() | _fused(_experts(), "qwen"), "qwen3_moe")
    result = wbfe.score(folder, metrics="htsr").to_dict()
    experts = [layer for layer in result["layers"] if "[" in layer["name"]][:3]
    assert experts
    got = read_eigenvalues(folder, [layer["name"] for layer in experts], result["model"]["options"])
    for layer in experts:
        eigs, k = got[layer["name"]]
        assert eigs.size == layer["n_eigs"] and k == 0
        assert float(eigs.sum()) == pytest.approx(layer["norm"], rel=1e-9)
        _, spectrum = layer_spectrum(folder, layer["name"])
        assert spectrum.n_eigs == layer["n_eigs"]


@pytest.mark.parametrize("sub", [None, "text_config", "language_config", "llm_config"])
def test_expert_count_and_hidden_size_from_a_multimodal_models_language_config(sub: str) -> None:
    """A 3-D tensor outside an `experts` module is a stack of E experts when the config's expert count is E and its
    hidden size is one side, read where the model keeps them (wbfe.engine.experts.config_value, the heads' too)."""
    from wbfe.engine.experts import config_value, is_expert_stack

    sizes = {"num_local_experts": 4, "hidden_size": 16}
    config = sizes if sub is None else {"model_type": "x", sub: sizes}
    assert is_expert_stack("model.layers.0.moe.w1", (4, 8, 16), config)
    assert not is_expert_stack("model.layers.0.moe.w1", (4, 8, 16))  # no config: a 3-D tensor of no known kind
    assert not is_expert_stack("model.layers.0.moe.w1", (5, 8, 16), config)  # 5 is not the expert count
    assert config_value(config, "hidden_size") == 16 and config_value(config, "vocab_size") is None
    assert config_value(None, "hidden_size") is None
    # The model's own key wins over its language model's.
    assert config_value({"hidden_size": 8, "text_config": {"hidden_size": 16}}, "hidden_size") == 8
