"""summary.bfe_applicability: the BFE-W paper's conditions checked from the checkpoint's own
description (real Keras 3 files, transformers models saved with save_pretrained, a bare state
dict), and ``rank``'s ρ on the models where they hold (against scipy.stats.spearmanr)."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")

import wbfe  # noqa: E402
from wbfe.framework.applicability import RULES, applicability  # noqa: E402
from wbfe.framework import FrameworkDescription  # noqa: E402
from wbfe.render.text import score_table  # noqa: E402


def _verdict(path) -> dict:
    return wbfe.score(str(path), metrics="bfe").summary["bfe_applicability"]


# --- Keras 3 ----------------------------------------------------------------------------------

def _keras_models():
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(0)
    layers = keras.layers

    def seq(*body):
        return keras.Sequential([keras.Input((8, 8, 3)), *body])

    models = {
        "dropout_dense": seq(layers.Conv2D(4, 3, activation="relu"), layers.GlobalAveragePooling2D(),
                             layers.Dropout(0.3, name="drop"), layers.Dense(5)),
        "two_dense": seq(layers.Conv2D(4, 3, activation="relu"), layers.GlobalAveragePooling2D(),
                         layers.Dense(16, activation="relu"), layers.Dense(5)),
        # SqueezeNet's head: dropout, then a 1 x 1 convolution to the classes, then global pooling.
        "dropout_conv_head": seq(layers.Conv2D(4, 3, activation="relu"), layers.Dropout(0.5, name="d5"),
                                 layers.Conv2D(5, 1), layers.GlobalAveragePooling2D(), layers.Activation("softmax")),
        # Dropout far from the head (behind a Dense): not on the head's input.
        "dropout_earlier": seq(layers.Flatten(), layers.Dropout(0.4), layers.Dense(16, activation="relu"),
                               layers.Dense(5)),
    }
    inp = keras.Input((8,))
    x = layers.Dropout(0.2, name="fd")(layers.Dense(6, activation="relu")(inp))
    models["functional_dropout"] = keras.Model(inp, layers.Dense(3)(x))
    inp = keras.Input((8,))
    models["two_branches"] = keras.Model(inp, layers.Add()([layers.Dense(3)(inp), layers.Dense(3)(inp)]))
    return models


KERAS_EXPECTED = {
    "dropout_dense": ("fails", "drop (rate 0.3)"),
    "two_dense": ("holds", "one linear map"),
    "dropout_conv_head": ("fails", "d5 (rate 0.5)"),
    "dropout_earlier": ("holds", "one linear map"),
    "functional_dropout": ("fails", "fd (rate 0.2)"),
    "two_branches": ("fails", "no single head"),
}


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keras")
    paths = {}
    for name, model in _keras_models().items():
        for ext in (".keras", ".h5"):
            paths[name, ext] = folder / f"{name}{ext}"
            model.save(paths[name, ext])
    return paths


@pytest.mark.parametrize("ext", [".keras", ".h5"])
@pytest.mark.parametrize("name", sorted(KERAS_EXPECTED))
def test_keras_graph(keras_files, name, ext):
    verdict = _verdict(keras_files[name, ext])
    status, cited = KERAS_EXPECTED[name]
    assert verdict["status"] == status
    assert cited in verdict["reasons"][0]
    if status == "fails" and "rate" in cited:
        assert "MNASNet: Spearman rho 0.00" in verdict["reasons"][0]


# --- transformers -----------------------------------------------------------------------------

def _save(model, path):
    model.save_pretrained(path)
    return path


def _bert(p: float, labels: int = 3):
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        hidden_dropout_prob=p, num_labels=labels))


def test_bert_with_hidden_dropout_fails(tmp_path):
    verdict = _verdict(_save(_bert(0.1), tmp_path / "bert"))
    assert verdict["status"] == "fails"
    assert verdict["reasons"] == [
        "dropout on the features the head reads: dropout (rate 0.1); the paper (arXiv 2610.13123) finds BFE-W uninformative when "
        "dropout precedes the last layer (VGG, EfficientNet, MNASNet: Spearman rho 0.00)"]


def test_bert_without_dropout_holds(tmp_path):
    verdict = _verdict(_save(_bert(0.0), tmp_path / "bert"))
    assert verdict["status"] == "holds"
    assert verdict["reasons"][0].startswith("BertForSequenceClassification: the head classifier.weight is one linear")


def test_vit_fails(tmp_path):
    from transformers import ViTConfig, ViTForImageClassification

    model = ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                intermediate_size=64, image_size=32, patch_size=8, num_labels=3))
    verdict = _verdict(_save(model, tmp_path / "vit"))
    assert verdict == {"status": "fails", "reasons": [
        "ViTForImageClassification is a vision transformer (model_type vit); the paper (arXiv 2610.13123) finds BFE-W does not "
        "track accuracy on vision transformers (ViT, Swin: rho +0.14)"],
        "checked": ["dropout_before_head", "vision_transformer", "single_linear_head"],
        "summary": "a vision transformer: outside the setting BFE-W is derived for"}


def test_llama_holds(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2, intermediate_size=64))
    verdict = _verdict(_save(model, tmp_path / "llama"))
    assert verdict["status"] == "holds"
    assert "lm_head.weight" in verdict["reasons"][0]
    # "holds" names what was checked and points to the measured evidence; it quotes no rho of the
    # paper's as if it were a prediction for this model.
    assert verdict["checked"] == ["dropout_before_head", "vision_transformer", "single_linear_head"]
    assert "the conditions checked (dropout_before_head, vision_transformer, single_linear_head) hold" in verdict[
        "reasons"][0]
    assert "docs/evidence.md" in verdict["reasons"][0]
    assert not re.search(r"rho [-+]?\d", verdict["reasons"][0])


@pytest.mark.parametrize("config, layer, rate", [
    ({"model_type": "roberta", "architectures": ["RobertaForSequenceClassification"], "vocab_size": 64,
      "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
      "hidden_dropout_prob": 0.1, "classifier_dropout": 0.3}, "classifier.dropout", 0.3),
    ({"model_type": "distilbert", "architectures": ["DistilBertForSequenceClassification"], "vocab_size": 64,
      "dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64, "seq_classif_dropout": 0.25}, "dropout", 0.25),
])
def test_config_fields_on_the_heads_path(config, layer, rate):
    from wbfe.framework.transformers_model import describe_transformers

    verdict = applicability(describe_transformers(config))
    assert verdict["status"] == "fails"
    assert f"reads: {layer} (rate {rate:g});" in verdict["reasons"][0]


# --- no description ---------------------------------------------------------------------------

def test_bare_state_dict_is_unknown(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    save_file({"fc.weight": rng.standard_normal((10, 40)).astype(np.float32)}, str(tmp_path / "w.safetensors"))
    result = wbfe.score(str(tmp_path / "w.safetensors"), metrics="bfe")
    verdict = result.summary["bfe_applicability"]
    assert verdict["status"] == "unknown"
    assert "add the model's config.json beside the weights" in verdict["reasons"][0]
    # The text table carries it as a line under the summary; the JSON as the summary field.
    assert "bfe applicability: unknown — no description of the model" in score_table(result)
    assert '"bfe_applicability"' in result.to_json()
    torch = pytest.importorskip("torch")
    state = {"fc.weight": torch.from_numpy(rng.standard_normal((10, 40)).astype(np.float32))}
    assert wbfe.score(state, metrics="bfe").summary["bfe_applicability"]["status"] == "unknown"


# --- the rules as a table ---------------------------------------------------------------------

def test_each_rule_fails_on_its_own_fact():
    base = dict(framework="timm", model="resnet18", order=("fc.weight",), head="fc.weight")
    cases = {
        "dropout_before_head": {"family": "resnet18", "dropout": [["drop_rate", 0.25]]},
        "vision_transformer": {"family": "vit_tiny_patch16_224"},
        "single_linear_head": {"family": "deit_base_distilled", "heads": ["head_dist"]},
    }
    assert [r.name for r in RULES] == list(cases)
    assert applicability(FrameworkDescription(**base, facts={"family": "resnet18"}))["status"] == "holds"
    for name, facts in cases.items():
        verdict = applicability(FrameworkDescription(**base, facts=facts))
        assert verdict["status"] == "fails", name
    # DeiT distilled is a vision transformer too: both reasons are given.
    both = applicability(FrameworkDescription(**{**base, "model": "deit"},
                                              facts={"family": "deit_base_distilled", "heads": ["head_dist"]}))
    assert len(both["reasons"]) == 2


def test_timm_drop_rate_and_vit():
    pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    from wbfe.framework.timm_model import describe_timm

    plain = describe_timm("resnet18", {"architecture": "resnet18", "pretrained_cfg": {}, "num_classes": 10})
    dropped = describe_timm("resnet18", {"architecture": "resnet18", "pretrained_cfg": {}, "num_classes": 10,
                                         "drop_rate": 0.2})
    vit = describe_timm("vit_tiny_patch16_224", {"architecture": "vit_tiny_patch16_224", "pretrained_cfg": {}})
    assert applicability(plain)["status"] == "holds"
    assert applicability(dropped)["status"] == "fails"
    assert "drop_rate (rate 0.2)" in applicability(dropped)["reasons"][0]
    assert "vision transformer" in applicability(vit)["reasons"][0]


def test_in_memory_modules():
    timm = pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    from wbfe.framework import describe_module

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    dropped = timm.create_model("efficientnet_b0", num_classes=5, drop_rate=0.2)
    assert "drop_rate (rate 0.2)" in applicability(describe_module(dropped))["reasons"][0]
    assert applicability(describe_module(timm.create_model("resnet18", num_classes=5)))["status"] == "holds"
    # A module that names no classifier: its head is its last nn.Linear, and the dropout reaching it
    # is read from the nn.Sequential around it (the one right before the head, not one before a hidden layer).
    plain = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Dropout(0.3), torch.nn.Linear(4, 4),
                                torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(4, 3))
    verdict = applicability(describe_module(plain))
    assert verdict["status"] == "fails", verdict
    assert verdict["reasons"][0].startswith("dropout on the features the head reads: 4 (rate 0.5); ")
    assert "the head 5.weight is the last nn.Linear registered in the module tree (3 outputs)" in verdict["reasons"][0]
    # Dropout only before the hidden layer: not on the head's input.
    hidden_only = torch.nn.Sequential(torch.nn.Dropout(0.3), torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    assert applicability(describe_module(hidden_only))["status"] == "holds"
    # No nn.Linear at all (a conv head), or a last Linear that does not map to num_classes: no head to read.
    conv_head = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Dropout(0.5), torch.nn.Conv2d(4, 10, 1))
    verdict = applicability(describe_module(conv_head))
    assert verdict["status"] == "unknown" and "no nn.Linear" in verdict["reasons"][0]
    odd = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 3))
    odd.num_classes = 5  # type: ignore[assignment]
    verdict = applicability(describe_module(odd))
    assert verdict["status"] == "unknown" and "does not map to its num_classes (5)" in verdict["reasons"][0]


def test_torchvision_modules_without_get_classifier():
    """torchvision's models name no classifier: VGG's head has Dropout(0.5) right before it (fails,
    naming classifier.5 and not classifier.2, which feeds a hidden layer), ResNet's fc has none (holds),
    and ViT is a vision transformer (fails)."""
    torchvision = pytest.importorskip("torchvision")
    from wbfe.framework import describe_module

    vgg = applicability(describe_module(torchvision.models.vgg11(weights=None)))
    assert vgg["status"] == "fails"
    assert vgg["reasons"] == [
        "dropout on the features the head reads: classifier.5 (rate 0.5); the paper (arXiv 2610.13123) finds BFE-W uninformative when "
        "dropout precedes the last layer (VGG, EfficientNet, MNASNet: Spearman rho 0.00); the head "
        "classifier.6.weight is the last nn.Linear registered in the module tree (1000 outputs): the module names "
        "no classifier (no get_classifier() or get_output_embeddings())"]
    resnet = applicability(describe_module(torchvision.models.resnet18(weights=None, num_classes=7)))
    assert resnet["status"] == "holds"
    assert "the head fc.weight is the last nn.Linear registered in the module tree (7 outputs)" in resnet["reasons"][0]
    efficientnet = applicability(describe_module(torchvision.models.efficientnet_b0(weights=None)))
    assert "classifier.0 (rate 0.2)" in efficientnet["reasons"][0]
    vit = applicability(describe_module(torchvision.models.vit_b_16(weights=None)))
    assert vit["status"] == "fails" and "VisionTransformer, a vision transformer" in vit["reasons"][0]


# --- ranking ----------------------------------------------------------------------------------

def test_rank_rho_on_the_models_where_it_holds(tmp_path, keras_files):
    from safetensors.numpy import save_file
    from scipy.stats import spearmanr

    from wbfe.ranking import rank
    from wbfe.ranking.zoo import Zoo, ZooEntry

    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(3)
    entries = []
    for k in range(12):
        status = ("holds", "fails", "unknown")[k % 3]
        width = 6 + 3 * k
        if status == "unknown":
            path = tmp_path / f"m{k}.safetensors"
            save_file({"fc.weight": rng.standard_normal((5, width)).astype(np.float32)}, str(path))
        else:
            keras.utils.set_random_seed(k)
            body = [keras.layers.Dense(width, activation="relu")]
            if status == "fails":
                body.append(keras.layers.Dropout(0.5))
            model = keras.Sequential([keras.Input((8,)), *body, keras.layers.Dense(5)])
            path = tmp_path / f"m{k}.keras"
            model.save(path)
        entries.append(ZooEntry(f"m{k}", str(path), {"acc": float(rng.uniform(0.5, 0.9))}))
    zoo = Zoo("mixed", tuple(entries), ("acc",))
    result = rank(zoo, "acc", metrics="bfe", cache_dir=False, n_boot=200, n_perm=200)
    assert result.applicability == {"holds": 4, "fails": 4, "unknown": 4}
    statuses = {m.model: m.applicability for m in result.models}
    row = result.metric("bfe_head")
    holds = [m for m in result.models if statuses[m.model] == "holds"]
    expected = spearmanr([m.scores["bfe_head"] for m in holds], [m.quality for m in holds]).statistic
    assert row.applicable["n"] == 4
    assert math.isclose(row.applicable["rho"], expected, abs_tol=1e-12)
    everyone = spearmanr([m.scores["bfe_head"] for m in result.models], [m.quality for m in result.models]).statistic
    assert math.isclose(row.rho, everyone, abs_tol=1e-12)
    assert result.to_dict()["metrics"][0]["applicable"]["n"] == 4
    from wbfe_cli.rank import rank_table

    table = rank_table(result)
    assert "BFE-W applicability: holds 4, fails 4, unknown 4" in table
    line = next(t for t in table.splitlines() if t.startswith("bfe_head "))
    assert f"holds: {expected:+.3f} [" in line and line.endswith("n=4")


def test_report_page_says_it(keras_files):
    from wbfe.reporting.content import Paragraph
    from wbfe.reporting.model import score_report

    result = wbfe.score(str(keras_files["dropout_dense", ".keras"]), metrics="bfe")
    texts = [b.text for s in score_report(result).sections for b in s.blocks if isinstance(b, Paragraph)]
    said = [t for t in texts if t.startswith("bfe applicability: fails — dropout on the features the head reads: drop")]
    assert len(said) == 1


@pytest.mark.parametrize("framework,family", [("transformers", "vit"), ("transformers", "deit"), ("timm", "vit_tiny_patch16_224")])
def test_a_vision_transformer_whose_description_names_no_head_fails(framework, family):
    """The vision-transformer finding is about the architecture: it decides even where no head is
    named (a ViTModel without classifier, DeiT with its teacher head), before the no-head fallback."""
    from wbfe.framework.applicability import applicability
    from wbfe.framework.description import FrameworkDescription

    d = FrameworkDescription(framework, "ViTModel", ("encoder.weight",), None, facts={"family": family})
    verdict = applicability(d)
    assert verdict["status"] == "fails" and "vision transformer" in verdict["reasons"][0]
    plain = FrameworkDescription(framework, "BertModel", ("encoder.weight",), None, facts={"family": "bert"})
    assert applicability(plain)["status"] == "unknown"


# --- a head that reads a summary stage (XLNet's SequenceSummary) -------------------------------

def _xlnet(**dropouts):
    import torch
    from transformers import XLNetConfig, XLNetForSequenceClassification

    from wbfe.framework import describe_module
    with torch.device("meta"):
        model = XLNetForSequenceClassification(XLNetConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2,
                                                           d_inner=64, num_labels=3, **dropouts))
    return applicability(describe_module(model))


def test_xlnet_dropout_after_its_summary_linear_fails():
    """transformers' SequenceSummary runs first_dropout → summary linear → tanh → last_dropout before
    logits_proj: last_dropout is on the features the head is trained on (XLNetConfig's default 0.1)."""
    pytest.importorskip("transformers")
    default_last = _xlnet(summary_first_dropout=0.0)
    assert default_last["status"] == "fails"
    assert default_last["reasons"][0].startswith(
        "dropout on the features the head reads: sequence_summary.last_dropout (rate 0.1); ")


def test_xlnet_dropout_before_its_summary_linear_is_a_hidden_layers_and_holds():
    """first_dropout feeds the summary's linear layer, not logits_proj: the same rule as a dropout
    behind another layer of an nn.Sequential or a Keras graph (not counted), named in the reason.
    SequenceSummary registers first_dropout after its linear layer, so only the forward order says
    which side of it a dropout is on."""
    pytest.importorskip("transformers")
    verdict = _xlnet(summary_first_dropout=0.2, summary_last_dropout=0.0)
    assert verdict["status"] == "holds", verdict
    assert ("(the summary stage sequence_summary, a linear map and an activation, makes those features; its dropout "
            "sequence_summary.first_dropout (rate 0.2) acts before its linear map") in verdict["reasons"][0]
    both = _xlnet(summary_first_dropout=0.2, summary_last_dropout=0.3)
    assert both["status"] == "fails"
    assert "sequence_summary.last_dropout (rate 0.3)" in both["reasons"][0]
    assert "first_dropout" not in both["reasons"][0]


def test_a_summary_stage_is_read_in_its_forward_order_not_its_registration_order():
    """Two stages with the same children registered in the same order, whose forward passes put the
    dropout on opposite sides of the linear layer: only the one after it is on the head's input."""
    torch = pytest.importorskip("torch")
    from wbfe.framework.head_facts import head_facts

    class Stage(torch.nn.Module):
        def __init__(self, dropout_last: bool):
            super().__init__()
            self.dropout_last = dropout_last
            self.dense = torch.nn.Linear(8, 8)
            self.act = torch.nn.Tanh()
            self.drop = torch.nn.Dropout(0.25)

        def forward(self, x):
            return (self.drop(self.act(self.dense(x))) if self.dropout_last
                    else self.act(self.dense(self.drop(x))))

    class Net(torch.nn.Module):
        def __init__(self, dropout_last: bool):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Sequential(torch.nn.ReLU()))
            self.pool = Stage(dropout_last)
            self.out = torch.nn.Linear(8, 3)

    after = head_facts(Net(True), "out.weight")
    before = head_facts(Net(False), "out.weight")
    assert after["dropout"] == [["pool.drop", 0.25]] and "hidden_dropout" not in after
    assert before["dropout"] == [] and before["hidden_dropout"] == [["pool.drop", 0.25]]


def test_xlnet_without_summary_dropout_holds():
    pytest.importorskip("transformers")
    verdict = _xlnet(summary_first_dropout=0.0, summary_last_dropout=0.0)
    assert verdict["status"] == "holds", verdict
    assert ("the head logits_proj.weight is one linear map of the last features with no dropout before it (the "
            "summary stage sequence_summary, a linear map and an activation, makes those features)") in verdict["reasons"][0]


def test_every_reason_cites_the_papers_condition():
    """Each branch's reasons name the paper and its condition; an ``unknown`` reason also says what
    would decide it (the brief of issue #30: a reader must see why, not only a status)."""
    def desc(head="fc.weight", **facts):
        return FrameworkDescription("torch", "Net", ("fc.weight",), head, facts=facts)

    condition = "BFE-W is derived for a decoupled linear last layer at interpolation (arXiv 2610.13123)"
    unknown = [applicability(None), applicability(None, {"model_type": "nothing"}), applicability(desc(head=None)),
               applicability(desc(dropout_unrecorded="an inference graph: converters remove Dropout"))]
    for verdict in unknown:
        assert verdict["status"] == "unknown", verdict
        (reason,) = verdict["reasons"]
        assert condition in reason and "decide" in reason.rpartition(condition)[2], reason
    fails = applicability(desc(dropout=[["drop", 0.5]], heads=["fc2"], head_class="LSTM", family="x"))
    assert fails["status"] == "fails" and len(fails["reasons"]) == 2
    vit = applicability(FrameworkDescription("timm", "vit", ("head.weight",), "head.weight", facts={"family": "vit_s"}))
    holds = applicability(desc())
    assert holds["status"] == "holds"
    for reason in [*fails["reasons"], *vit["reasons"], *holds["reasons"]]:
        assert "arXiv 2610.13123" in reason, reason
    assert "uninformative when dropout precedes the last layer" in fails["reasons"][0]
    assert "a decoupled linear last layer" in holds["reasons"][0]
