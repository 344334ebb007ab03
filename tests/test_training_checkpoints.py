"""A training checkpoint holds more than the weights: an optimizer's moments, a scheduler's state. Every tensor in it is
scored or listed as skipped with its reason, and an edit copies them as they are, saying so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import wbfe
from wbfe.editing import smooth_checkpoint


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(50, 80), torch.nn.ReLU(), torch.nn.Linear(80, 10))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 50)).sum().backward()
    opt.step()
    return model, opt


def _moments(opt: torch.optim.Optimizer, prefix: str) -> dict[str, torch.Tensor]:
    """The optimizer's tensors by the names they are listed under: ``<prefix>state.<param>.<name>``."""
    return {f"{prefix}state.{p}.{k}": v for p, state in opt.state_dict()["state"].items() for k, v in state.items()}


@pytest.mark.parametrize("how", ["zip", "legacy", "in_memory"])
def test_optimizer_state_is_listed(tmp_path: Path, how: str) -> None:
    model, opt = _trained()
    checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}
    torch.save(checkpoint, tmp_path / "ckpt.pt", _use_new_zipfile_serialization=how != "legacy")
    result = wbfe.score(checkpoint if how == "in_memory" else tmp_path / "ckpt.pt")
    assert [layer["name"] for layer in result.layers] == ["0.weight", "2.weight"]
    moments = _moments(opt, "optimizer/")
    assert len(moments) == 12  # step, exp_avg, exp_avg_sq of four parameters
    listed = {s["name"]: s for s in result.skipped if s["name"].startswith("optimizer/")}
    assert listed.keys() == moments.keys()
    for name, tensor in moments.items():
        assert listed[name]["reason"] == "optimizer state (in 'optimizer'), not a weight"
        assert listed[name]["shape"] == list(tensor.shape)
    # the moments are no matrices of the model's: the head is the model's own, as without them (the 2-D moments read
    # as skipped matrices that feed no other, and the head was refused)
    plain = wbfe.score(model.state_dict())
    assert (result.summary, result.layers) == (plain.summary, plain.layers) and result.summary["head"] == "2.weight"


def test_lightning_optimizer_states_and_other_tensors_are_listed(tmp_path: Path) -> None:
    model, opt = _trained()
    sched = {"last_epoch": 1, "base_lrs": [0.1], "momentum": torch.ones(3)}
    torch.save({"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()], "lr_schedulers": [sched],
                "callbacks": {"ckpt": {"best_model_score": torch.tensor(0.5)}}}, tmp_path / "last.ckpt")
    skipped = {s["name"]: s["reason"] for s in wbfe.score(tmp_path / "last.ckpt").skipped}
    for name in _moments(opt, "optimizer_states/0."):
        assert skipped[name] == "optimizer state (in 'optimizer_states'), not a weight"
    assert skipped["lr_schedulers/0.momentum"] == "in 'lr_schedulers', beside the state dict scored: not a weight"
    assert skipped["callbacks/ckpt.best_model_score"] == "in 'callbacks', beside the state dict scored: not a weight"


def test_smooth_copies_the_optimizer_state_unedited_and_says_so(tmp_path: Path) -> None:
    model, opt = _trained()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, tmp_path / "ckpt.pt")
    summary = smooth_checkpoint(tmp_path / "ckpt.pt", tmp_path / "out.safetensors")
    written: dict[str, Any] = load_file(str(tmp_path / "out.safetensors"))
    assert set(summary.edited) == {"0.weight", "2.weight"}
    moments = _moments(opt, "optimizer/")
    assert written.keys() == {"0.weight", "0.bias", "2.weight", "2.bias", *moments}
    for name, tensor in moments.items():  # copied byte for byte
        assert torch.equal(written[name], tensor)
    # the 2-D moments are weight-shaped: listed as left unedited, with the score's reason
    assert summary.unchanged == {name: "not a weight the score reads (optimizer state (in 'optimizer'), not a weight)"
                                 for name, tensor in moments.items() if tensor.ndim == 2}
