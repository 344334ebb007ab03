"""A timm MLP-Mixer saved in the Hugging Face hub layout (model.safetensors beside timm's
config.json: ``architecture`` mixer_b16_224, the ``model_args`` it was built with, ``pretrained_cfg``)
is described by timm itself (wbfe/framework/timm_model.py): its head is the weight of the module the
model's own ``get_classifier()`` returns, its ``model_args`` build the model timm's hub loader would
build (dropout into the head included), and an all-zero head (timm initialises the Mixer's head to
zero) is reported as such, never replaced by another matrix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import wbfe
from wbfe.metrics.bfe import bfe_from_moments

timm = pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
from timm.models.mlp_mixer import MlpMixer  # noqa: E402

ARGS = {"num_classes": 5, "img_size": [32, 32], "in_chans": 3, "global_pool": "avg"}


def _save(folder: Path, model: Any, model_args: dict[str, Any]) -> Path:
    """The layout timm's ``save_for_hf`` writes, for a mixer_b16_224-like model made tiny."""
    from safetensors.torch import save_file

    folder.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architecture": "mixer_b16_224", "num_classes": 5, "num_features": model.num_features, "global_pool": "avg",
        "model_args": model_args,
        "pretrained_cfg": {"tag": "goog_in21k_ft_in1k", "input_size": [3, 32, 32], "fixed_input_size": True,
                           "num_classes": 5, "first_conv": "stem.proj", "classifier": "head"}}))
    return folder


def _tiny(trained_head: bool = True) -> MlpMixer:
    torch.manual_seed(0)
    model = MlpMixer(num_classes=5, img_size=32, patch_size=16, embed_dim=32, num_blocks=2).eval()
    if trained_head:  # timm initialises the head to zero; a trained one is not
        with torch.no_grad():
            model.head.weight.normal_(std=0.1)
    return model


def test_the_head_is_the_weight_of_get_classifier(tmp_path: Path) -> None:
    model = _tiny()
    result = wbfe.score(_save(tmp_path / "mixer", model, ARGS), metrics="bfe")
    classifier = model.get_classifier()
    name = next(n for n, m in model.named_modules() if m is classifier) + ".weight"
    assert (result.summary["head"], result.summary["head_source"]) == (name, "framework")
    assert result.model["framework"] == {"used": "timm", "model": "mixer_b16_224"}
    w = classifier.weight.detach().double().numpy()
    e = np.linalg.eigvalsh(w @ w.T)
    assert result.summary["bfe_head"] == pytest.approx(
        bfe_from_moments(float(e.mean()), float(np.log(e).mean()), "opt")[0], rel=1e-9)


def test_model_args_build_the_model_timm_would_dropout_included(tmp_path: Path) -> None:
    """timm's hub loader builds the model with the config's model_args: here a head dropout, which
    makes BFE-W's conditions fail (no top-level drop_rate says so)."""
    result = wbfe.score(_save(tmp_path / "mixer", _tiny(), {**ARGS, "drop_rate": 0.5}), metrics="bfe")
    assert result.summary["head"] == "head.weight"
    verdict = result.summary["bfe_applicability"]
    assert verdict["status"] == "fails" and "head_drop (rate 0.5)" in verdict["reasons"][0]


def test_model_args_that_would_read_a_file_are_never_passed(tmp_path: Path) -> None:
    args = {**ARGS, "checkpoint_path": str(tmp_path / "elsewhere.pth"), "pretrained": True}
    result = wbfe.score(_save(tmp_path / "mixer", _tiny(), args), metrics="bfe")
    assert (result.summary["head"], result.summary["head_source"]) == ("head.weight", "framework")


def test_an_all_zero_head_is_named_and_no_other_matrix_stands_in(tmp_path: Path) -> None:
    result = wbfe.score(_save(tmp_path / "mixer", _tiny(trained_head=False), ARGS), metrics="bfe")
    assert result.summary["head"] is None
    assert result.summary["head_note"] == ("timm mixer_b16_224: the head head.weight is an all-zero matrix "
                                           "(an untrained or zeroed classifier), so no head is scored")
