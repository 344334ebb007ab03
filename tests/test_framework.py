"""The checkpoint's own description decides head, order and orientation (wbfe.framework), checked
against the frameworks themselves: tiny transformers models built by `from_config` and saved with
`save_pretrained`, a timm model saved with its timm config.json, and the pure helpers
(`order_rows`, `out_in`, the Keras layer graph) on closed cases. Files written by Keras itself are in
tests/test_keras_framework.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import wbfe
from wbfe.engine.matrices import as_matrices, plan_matrix
from wbfe.errors import InvalidOptionError
from wbfe.framework import (
    FrameworkDescription,
    check_layout,
    describe_config,
    order_rows,
    out_in,
)
from wbfe.framework.keras_graph import keras_head
from wbfe.metrics.bfe import bfe_from_moments

# ---- pure helpers ------------------------------------------------------------------------------

def test_order_rows_puts_rows_in_the_models_order() -> None:
    stored = ["lm_head.weight", "model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight",
              "model.layers.0.self_attn.q_proj.weight", "model.layers.10.mlp.down_proj.weight",
              "model.layers.2.mlp.down_proj.weight"]
    order = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.mlp.down_proj.weight", "model.layers.2.mlp.down_proj.weight",
             "model.layers.10.mlp.down_proj.weight", "lm_head.weight"]
    rows = [{"name": n} for n in stored]
    assert [r["name"] for r in order_rows(rows, order)] == order
    assert order_rows(rows, None) == rows and order_rows(rows, ()) == rows


def test_order_rows_places_unlisted_weights_with_their_module() -> None:
    order = ["embed.weight", "layers.0.mlp.experts.gate_up_proj", "layers.0.mlp.experts.down_proj",
             "layers.0.attn.q.weight", "head.weight"]
    stored = ["head.weight", "layers.0.attn.q.weight", "layers.0.mlp.experts.1.down_proj.weight",
              "layers.0.mlp.experts.0.down_proj.weight", "layers.0.mlp.experts.down_proj[1]",
              "layers.0.mlp.experts.down_proj[0]", "stray.weight", "embed.weight"]
    got = [r["name"] for r in order_rows([{"name": n} for n in stored], order)]
    # Per-expert copies go after the last listed weight of their module, in stored order among
    # themselves; a split fused stack ``w[e]`` goes with ``w``; a name sharing nothing goes last.
    assert got == ["embed.weight", "layers.0.mlp.experts.1.down_proj.weight",
                   "layers.0.mlp.experts.0.down_proj.weight", "layers.0.mlp.experts.down_proj[1]",
                   "layers.0.mlp.experts.down_proj[0]", "layers.0.attn.q.weight", "head.weight", "stray.weight"]
    # An alias (a weight stored under the model's in-memory name) goes to the described name's place.
    aliased = order_rows([{"name": "lm_head.weight"}, {"name": "embed.weight"}], ["embed.weight", "embed_out.weight"],
                         {"lm_head.weight": "embed_out.weight"})
    assert [r["name"] for r in aliased] == ["embed.weight", "lm_head.weight"]


def test_a_config_that_names_no_framework_has_no_description() -> None:
    for config in (None, ["architectures"], {}, {"model_type": "bert"}):  # not a dict, or no architecture named
        assert describe_config(config) is None


def test_out_in_and_layouts() -> None:
    assert out_in((10, 64)) == (10, 64) and out_in((64, 10), "in_out") == (10, 64)
    assert out_in((8, 16, 3, 3), "in_out") == (16, 8)  # ConvTranspose: [in, out, k...]
    with pytest.raises(InvalidOptionError, match="layout must be one of out_in, in_out, not 'kio'"):
        check_layout("kio")
    with pytest.raises(InvalidOptionError):
        plan_matrix("w", (4, 8), "float32", layout="kio")


def test_an_in_out_matrix_is_planned_and_viewed_out_by_in() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 96, generator=g)  # stored [in=24, out=96], as GPT-2's c_fc
    plan = plan_matrix("h.0.mlp.c_fc.weight", (24, 96), "float32", layout="in_out")
    assert (plan.rows, plan.cols, plan.layout) == (96, 24, "in_out")
    (m,) = as_matrices(w, plan)
    assert torch.equal(m, w.T)
    conv = torch.randn(6, 4, 3, 3, generator=g)  # ConvTranspose2d(6 -> 4): [in, out, kh, kw]
    plan = plan_matrix("up.weight", (6, 4, 3, 3), "float32", layout="in_out")
    (m,) = as_matrices(conv, plan)
    assert (plan.rows, plan.cols) == (4, 54) and torch.equal(m, conv.transpose(0, 1).reshape(4, 54))
    sliced = as_matrices(conv, plan_matrix("up.weight", (6, 4, 3, 3), "float32", conv="slices", layout="in_out"))
    assert len(sliced) == 9 and torch.equal(sliced[4], conv[:, :, 1, 1].T)


def _keras2_functional(layers: list[tuple[str, str, list[str]]], outputs: list[str]) -> dict[str, Any]:
    return {"class_name": "Functional", "config": {"name": "m", "layers": [
        {"class_name": cls, "name": name, "config": {"name": name},
         "inbound_nodes": [[[src, 0, 0, {}] for src in inbound]] if inbound else []}
        for name, cls, inbound in layers], "output_layers": [[o, 0, 0] for o in outputs]}}


def test_keras_head_walks_back_to_the_layer_with_a_matrix() -> None:
    squeeze = _keras2_functional([
        ("input_1", "InputLayer", []), ("conv1", "Conv2D", ["input_1"]),
        ("fire_s", "Conv2D", ["conv1"]), ("fire_e1", "Conv2D", ["fire_s"]), ("fire_e3", "Conv2D", ["fire_s"]),
        ("concat", "Concatenate", ["fire_e1", "fire_e3"]), ("drop", "Dropout", ["concat"]),
        ("conv10", "Conv2D", ["drop"]), ("relu", "Activation", ["conv10"]),
        ("gap", "GlobalAveragePooling2D", ["relu"]), ("loss", "Activation", ["gap"])], ["loss"])
    head, why = keras_head(squeeze)
    assert why is None and head is not None and head.layer.path == ("conv10",) and head.variables == ("kernel",)
    merged = _keras2_functional([("a", "Dense", []), ("b", "Dense", []), ("add", "Add", ["a", "b"])], ["add"])
    assert keras_head(merged) == (None, "the model's output layer add (Add) reads several layers: no single head")
    nested = {"class_name": "Sequential", "config": {"layers": [
        {"class_name": "InputLayer", "config": {"name": "in"}},
        {"class_name": "Functional", "config": {"name": "backbone", "layers": [
            {"class_name": "InputLayer", "name": "x", "config": {"name": "x"}, "inbound_nodes": []},
            {"class_name": "SeparableConv2D", "name": "sep", "config": {"name": "sep"},
             "inbound_nodes": [{"args": [{"config": {"keras_history": ["x", 0, 0]}}], "kwargs": {}}]}],
            "output_layers": [["sep", 0, 0]]}},
        {"class_name": "GlobalMaxPooling2D", "config": {"name": "pool"}}]}}
    head, _ = keras_head(nested)
    assert head is not None and head.layer.path == ("backbone", "sep") and head.variables == ("pointwise_kernel",)


# ---- transformers ------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")

# id -> (model_type, class, config, attribute path of the head module). 12 Llama layers: stored
# sorted, layer 10 comes before layer 2.
CASES: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "gpt2": ("gpt2", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=96),
             "lm_head"),
    "bert-3-labels": ("bert", "BertForSequenceClassification",
                      dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           vocab_size=96, num_labels=3), "classifier"),
    "llama-12-layers": ("llama", "LlamaForCausalLM",
                        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=12, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=96, tie_word_embeddings=False), "lm_head"),
    "vit-5-labels": ("vit", "ViTForImageClassification",
                     dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                          image_size=32, patch_size=8, num_labels=5), "classifier"),
    "t5": ("t5", "T5ForConditionalGeneration",
           dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8, vocab_size=96), "lm_head"),
}


def _build(case: str) -> Any:
    model_type, cls, overrides, _ = CASES[case]
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    return getattr(transformers, cls)(config)


def _stored(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module", params=list(CASES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path, Any]:
    case = request.param
    model = _build(case)
    folder = tmp_path_factory.mktemp(case)
    model.save_pretrained(folder)
    return case, model, folder, wbfe.score(folder, metrics="bfe")


def test_head_is_the_models_own(saved: tuple[str, Any, Path, Any]) -> None:
    case, model, folder, result = saved
    module = model
    for part in CASES[case][3].split("."):
        module = getattr(module, part)
    assert result.summary["head_source"] == "framework"
    assert result.model["framework"] == {"used": "transformers", "model": CASES[case][1],
                                         "dropout_read": "forward pass on the meta device"}
    stored = _stored(folder)[result.summary["head"]]
    assert torch.equal(stored, module.weight.detach())  # the very tensor transformers' head holds
    if model.get_output_embeddings() is not None:
        assert module is model.get_output_embeddings()


def test_rows_come_in_named_parameters_order(saved: tuple[str, Any, Path, Any]) -> None:
    case, model, folder, result = saved
    rows = [r["name"] for r in result.layers]
    stored = _stored(folder)
    # Each row's model parameter, found by its (random, so unique) values: transformers 5 saves some
    # models under other names than it holds them by (ViT's encoder.layer.0.attention.attention.query
    # is layers.0.attention.q_proj in memory).
    params = dict(model.named_parameters())
    owner = {row: next(n for n, p in params.items() if p.shape == stored[row].shape and torch.equal(p.detach(),
                                                                                                  stored[row]))
             for row in rows}
    position = {name: i for i, name in enumerate(params)}
    assert [position[owner[row]] for row in rows] == sorted(position[owner[row]] for row in rows)
    assert len(set(owner.values())) == len(rows)
    assert len(rows) + len(result.skipped) == len(_stored(folder))
    if case == "llama-12-layers":
        assert rows[-1] == "lm_head.weight" and rows[0] == "model.embed_tokens.weight"
        # Without its config the file alone is in (natural) name order: lm_head first.
        alone = [r["name"] for r in wbfe.score(folder / "model.safetensors", metrics="bfe").layers]
        assert alone[0] == "lm_head.weight" and alone != rows


def test_gpt2_conv1d_rows_are_out_by_in(tmp_path: Path) -> None:
    from transformers.pytorch_utils import Conv1D

    model = _build("gpt2")
    model.save_pretrained(tmp_path)
    result = wbfe.score(tmp_path, metrics="bfe")

    rows = {r["name"]: r for r in result.layers}
    conv1d = {f"{n}.weight": m for n, m in model.named_modules() if isinstance(m, Conv1D)}
    assert len(conv1d) == 2 * 4
    for name, module in conv1d.items():
        row = rows[name]
        out, inp = module.nf, module.weight.shape[0]  # Conv1D(nf, nx): y = x W + b, W is [nx, nf]
        assert (row["rows"], row["cols"]) == (out, inp)
        assert row["form"] == ("primal" if out <= inp else "dual")
        # The same numbers as the nn.Linear that holds W^T.
        linear = wbfe.score({"w": module.weight.detach().T.contiguous()}, metrics="bfe").layers[0]
        assert row["bfe"] == pytest.approx(linear["bfe"], rel=1e-12) and row["form"] == linear["form"]
    assert rows["transformer.h.0.mlp.c_fc.weight"]["form"] == "dual"  # 32 -> 128: more outputs
    assert rows["transformer.h.0.mlp.c_proj.weight"]["form"] == "primal"  # 128 -> 32


def test_config_with_remote_code_is_never_run_and_the_rules_decide(tmp_path: Path) -> None:
    model = _build("llama-12-layers")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(architectures=["MyLlamaForCausalLM"], auto_map={"AutoModelForCausalLM": "modeling_my.MyLlama"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "modeling_my.py").write_text("raise SystemExit('remote code ran')\n")
    result = wbfe.score(tmp_path, metrics="bfe")
    assert result.model["framework"] == {
        "used": "rules", "why": "MyLlamaForCausalLM is defined by the checkpoint's own code (auto_map), which wbfe "
                                "never runs"}
    assert (result.summary["head"], result.summary["head_source"]) == ("lm_head.weight", "config")
    assert result.layers[0]["name"] == "lm_head.weight"  # no model order: the file's


def test_description_is_cached_per_config(tmp_path: Path) -> None:
    _build("bert-3-labels").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    first = describe_config(config)
    assert isinstance(first, FrameworkDescription) and describe_config(dict(config)) is first
    assert first.head == "classifier.weight" and first.order[0] == "bert.embeddings.word_embeddings.weight"


def test_a_plain_safetensors_file_does_not_import_transformers(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    save_file({"a.weight": torch.randn(16, 8, generator=g), "b.weight": torch.randn(4, 16, generator=g)},
              str(tmp_path / "m.safetensors"))
    code = ("import sys, wbfe; r = wbfe.score(sys.argv[1], metrics='bfe'); "
            "print(r.summary['head'], 'transformers' in sys.modules, 'timm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.safetensors")], capture_output=True,
                         text=True, check=True, timeout=120).stdout.split()
    assert out == ["b.weight", "False", "False"]


# ---- timm --------------------------------------------------------------------------------------

def test_timm_folder_is_described_by_timm(tmp_path: Path) -> None:
    timm = pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=7)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "architecture": "test_resnet", "num_classes": 7, "num_features": model.num_features,
        "pretrained_cfg": {"classifier": "fc", "num_classes": 7}}))
    result = wbfe.score(tmp_path, metrics="bfe")
    classifier = model.get_classifier()
    name = next(n for n, m in model.named_modules() if m is classifier) + ".weight"
    assert (result.summary["head"], result.summary["head_source"]) == (name, "framework")
    assert result.model["framework"] == {"used": "timm", "model": "test_resnet"}
    rows = [r["name"] for r in result.layers]
    assert rows == [n for n, _ in model.named_parameters() if n in set(rows)]
    head = next(r for r in result.layers if r["name"] == name)
    w = classifier.weight.detach().double().numpy()
    e = np.linalg.eigvalsh(w @ w.T)
    assert head["bfe"] == pytest.approx(bfe_from_moments(float(e.mean()), float(np.log(e).mean()), "opt")[0], rel=1e-9)


def test_timm_name_with_a_bare_checkpoint_is_described_by_timm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``timm:<name>`` whose weights are a URL's .pth in the torch hub cache (no config beside it)."""
    timm = pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    from types import SimpleNamespace

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False)
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    # Saved in sorted order, as a converted checkpoint often is: fc before the stem.
    state = {k: v.contiguous() for k, v in sorted(model.state_dict().items())}
    torch.save(state, tmp_path / "hub" / "checkpoints" / "test_resnet.pth")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(timm.models, "get_pretrained_cfg",
                        lambda name: SimpleNamespace(hf_hub_id=None, url="https://example.invalid/test_resnet.pth"))
    result = wbfe.score("timm:test_resnet", metrics="bfe")
    assert (result.summary["head"], result.summary["head_source"]) == ("fc.weight", "framework")
    rows = [r["name"] for r in result.layers]
    assert rows == [n for n, _ in model.named_parameters() if n in set(rows)]
    assert rows[-1] == "fc.weight" and max(rows) != "fc.weight"  # the model's order, not the file's (sorted)


def test_an_in_memory_model_describes_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """describe_module on the objects themselves, and through MemorySource: a module scored in
    memory gets its order, head and layouts from the module itself."""
    from wbfe.framework import describe_module
    from wbfe.sources import MemorySource

    gpt2 = _build("gpt2")
    described = describe_module(gpt2)
    assert described is not None and described.framework == "transformers"
    assert described.head == "lm_head.weight" and described.tied == {"lm_head.weight": "transformer.wte.weight"}
    assert described.layout_of("transformer.h.1.mlp.c_fc.weight") == "in_out"
    assert describe_module({"w": torch.zeros(2, 2)}) is None
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ConvTranspose2d(8, 4, 3))
    assert describe_module(net).layouts == {"1.weight": "in_out"}

    assert MemorySource(gpt2).own_description is not None  # a module describes itself; a state dict does not
    assert MemorySource(gpt2.state_dict()).own_description is None
    result = wbfe.score(gpt2, metrics="bfe")
    rows = {r["name"]: r for r in result.layers}
    assert rows["transformer.h.0.mlp.c_fc.weight"]["form"] == "dual"
    assert (result.summary["head"], result.summary["head_source"]) == ("transformer.wte.weight", "framework")
    assert [r["name"] for r in result.layers] == [n for n, _ in gpt2.named_parameters() if n in rows]


def test_a_description_without_a_head_leaves_the_rules_to_decide_and_says_why() -> None:
    from wbfe.engine.heads import choose_head

    layers = [{"name": "a", "shape": [32, 16], "role": "mlp"}, {"name": "b", "shape": [16, 32], "role": "mlp"},
              {"name": "out", "shape": [4, 16], "role": "other"}]
    described = FrameworkDescription("keras", "Functional", ("a", "b", "out"), None,
                                     note="the model's output layer add (Add) reads several layers: no single head")
    choice = choose_head(layers, description=described)
    assert (choice.name, choice.source) == ("out", "structure")
    assert choice.note == "keras: the model's output layer add (Add) reads several layers: no single head"
    # A head the description names wins over the rules; a GPT-2-like in_out matrix reads out x in.
    named = FrameworkDescription("transformers", "X", ("a", "b", "out"), "b", layouts={"b": "in_out"})
    assert choose_head(layers, description=named).source == "framework"
