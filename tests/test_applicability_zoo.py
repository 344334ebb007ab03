"""BFE-W applicability of the architectures the paper's ablation names (arXiv 2610.13123): vision
transformers (Swin, DeiT with its distillation head) fail, image classifiers with dropout before the
head (EfficientNet, MobileNetV2) fail naming the layer and rate, and the same without dropout hold.
Tiny configurations, built by the frameworks themselves (transformers from a config, timm and
torchvision without weights): the facts are the frameworks' own module trees."""

from __future__ import annotations

import pytest

import wbfe
from wbfe.framework.applicability import applicability
from wbfe.framework import describe_module


def _meta(build):
    import torch

    with torch.device("meta"):
        return build()


def test_swin_from_its_config_fails_as_a_vision_transformer(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                                     window_size=2, num_labels=3)
    transformers.SwinForImageClassification(config).save_pretrained(tmp_path / "swin")
    verdict = wbfe.score(str(tmp_path / "swin"), metrics="bfe").summary["bfe_applicability"]
    assert verdict["status"] == "fails"
    assert verdict["reasons"] == [
        "SwinForImageClassification is a vision transformer (model_type swin); the paper (arXiv 2610.13123) finds "
        "BFE-W does not track accuracy on vision transformers (ViT, Swin: rho +0.14)"]


def test_deit_distilled_fails_as_a_vision_transformer_with_two_heads():
    """DeiTForImageClassificationWithTeacher averages cls_classifier with distillation_classifier:
    a vision transformer, and no single last layer (its class name ends in ...WithTeacher, which
    still makes it a classification task with num_labels outputs)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.DeiTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                     image_size=32, patch_size=8, num_labels=3)
    description = describe_module(_meta(lambda: transformers.DeiTForImageClassificationWithTeacher(config)))
    assert description.head == "distillation_classifier.weight"
    verdict = applicability(description)
    assert verdict == {"status": "fails", "reasons": [
        "DeiTForImageClassificationWithTeacher is a vision transformer (model_type deit); the paper "
        "(arXiv 2610.13123) finds BFE-W does not track accuracy on vision transformers (ViT, Swin: rho +0.14)",
        "the output combines the head distillation_classifier.weight with cls_classifier (several heads, no single "
        "last layer); BFE-W is derived for one linear last layer on the last features (arXiv 2610.13123); the "
        "paper's derivation does not cover this head"],
        "checked": ["dropout_before_head", "vision_transformer", "single_linear_head"],
        "summary": "a vision transformer; not one linear head: outside the setting BFE-W is derived for"}


@pytest.mark.parametrize("arch", ["efficientnet_b0", "mobilenetv2_050"])
def test_timm_drop_rate_before_the_head(arch):
    timm = pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    dropped = applicability(describe_module(_meta(lambda: timm.create_model(arch, pretrained=False, num_classes=5,
                                                                             drop_rate=0.2))))
    assert dropped["status"] == "fails"
    assert dropped["reasons"][0].startswith("dropout on the features the head reads: drop_rate (rate 0.2); the paper")
    plain = applicability(describe_module(_meta(lambda: timm.create_model(arch, pretrained=False, num_classes=5,
                                                                           drop_rate=0.0))))
    assert plain["status"] == "holds", plain
    assert "the head classifier.weight is one linear map of the last features with no dropout" in plain["reasons"][0]


@pytest.mark.parametrize("build", ["mobilenet_v2", "efficientnet_b0"])
def test_torchvision_dropout_before_the_head(build):
    """torchvision's classifier is ``Sequential(Dropout(p), Linear)``: the reason names classifier.0 and p."""
    torchvision = pytest.importorskip("torchvision")
    make = getattr(torchvision.models, build)
    dropped = applicability(describe_module(_meta(lambda: make(weights=None, num_classes=5, dropout=0.3))))
    assert dropped["status"] == "fails"
    assert dropped["reasons"][0].startswith("dropout on the features the head reads: classifier.0 (rate 0.3); ")
    plain = applicability(describe_module(_meta(lambda: make(weights=None, num_classes=5, dropout=0.0))))
    assert plain["status"] == "holds", plain
    assert "the head classifier.1.weight is one linear map" in plain["reasons"][0]
