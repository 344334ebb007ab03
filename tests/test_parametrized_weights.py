"""Weights torch stores as parts (weight norm's g and v, spectral norm's weight with u and v) are scored as the
weight the model uses: torch's own module.weight (in eval mode) is the reference, scored from a plain file."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import wbfe
from wbfe.editing import smooth_checkpoint
from wbfe.engine import entries
from wbfe.errors import UnsupportedDtypeError
from wbfe.sources import open_source

Maker = Callable[[], torch.nn.Module]


def _legacy(fn: Callable[..., torch.nn.Module]) -> Callable[..., torch.nn.Module]:
    def make(*args: Any, **kwargs: Any) -> torch.nn.Module:
        with warnings.catch_warnings():  # torch.nn.utils.weight_norm is deprecated, and still in checkpoints
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    return make


P = torch.nn.utils.parametrizations
MODULES: dict[str, Maker] = {
    "weight_norm_dim2": lambda: P.weight_norm(torch.nn.Conv1d(24, 24, 8), name="weight", dim=2),  # wav2vec2's
    "weight_norm_dim0": lambda: P.weight_norm(torch.nn.Linear(30, 20)),
    "weight_norm_whole": lambda: P.weight_norm(torch.nn.Linear(30, 20), dim=None),
    "legacy_weight_norm": lambda: _legacy(torch.nn.utils.weight_norm)(torch.nn.Conv1d(24, 24, 8), dim=2),
    "spectral_norm": lambda: P.spectral_norm(torch.nn.Linear(30, 20)),
    "spectral_norm_transposed": lambda: P.spectral_norm(torch.nn.ConvTranspose2d(5, 7, 3)),
    "legacy_spectral_norm": lambda: torch.nn.utils.spectral_norm(torch.nn.Conv2d(5, 7, 3)),
}


def _trained(key: str) -> torch.nn.Module:
    """The module after two training steps (g, v, u moved off their initial values), then in eval mode (and run once:
    torch.nn.utils' hooks set module.weight in the forward pass, parametrizations compute it when it is read)."""
    torch.manual_seed(0)
    module = MODULES[key]()
    shape = (4, 30) if isinstance(module, torch.nn.Linear) else (4, 24, 40) if isinstance(
        module, torch.nn.Conv1d) else (4, 5, 9, 9)
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        module(torch.randn(shape)).square().sum().backward()
        opt.step()
    with torch.no_grad():
        module.eval()(torch.randn(shape))
    return module


def _save(module: torch.nn.Module, path: Path, prefix: str = "enc.conv.") -> Path:
    state = {prefix + k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}
    if path.suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


def _plain(module: torch.nn.Module, path: Path) -> Path:
    """The reference: a file holding torch's module.weight (and the bias), as the model uses them."""
    save_file({"enc.conv.weight": module.weight.detach().clone().contiguous(),
               "enc.conv.bias": module.bias.detach().clone()}, str(path))
    return path


@pytest.mark.parametrize("suffix", [".safetensors", ".bin"])
@pytest.mark.parametrize("key", sorted(MODULES))
def test_composed_weight_is_torchs_module_weight(tmp_path: Path, key: str, suffix: str) -> None:
    module = _trained(key)
    path = _save(module, tmp_path / f"m{suffix}")
    with open_source(path) as source:
        listed = {entry.name: (entry, why) for entry, why in entries(source)}
    entry, why = listed["enc.conv.weight"]
    assert why is None and entry.quant is not None and entry.quant.startswith(key.removeprefix("legacy_").split("_")[0])
    np.testing.assert_allclose(entry.load(), module.weight.detach().double().numpy(), rtol=1e-5, atol=1e-7)
    parts = {name: reason for name, (_, reason) in listed.items() if name not in ("enc.conv.weight", "enc.conv.bias")}
    assert len(parts) in (2, 3) and all(r.startswith("consumed: ") and "of enc.conv.weight" in r for r in parts.values())

    got, ref = wbfe.score(path), wbfe.score(_plain(module, tmp_path / "plain.safetensors"))
    assert [layer["name"] for layer in got.layers] == ["enc.conv.weight"]
    assert got.layers[0]["quant"] == entry.quant  # the note that it was composed
    for column in ("bfe", "norm", "spectral_norm", "stable_rank"):
        assert got.layers[0][column] == pytest.approx(ref.layers[0][column], rel=1e-5)
    assert {s["name"] for s in got.skipped} == {"enc.conv.bias", *parts}


def test_in_memory_module_is_scored_as_its_file(tmp_path: Path) -> None:
    module = _trained("weight_norm_dim2")
    got, ref = wbfe.score(module), wbfe.score(_plain(module, tmp_path / "plain.safetensors"))
    assert [layer["name"] for layer in got.layers] == ["weight"]
    assert got.layers[0]["bfe"] == pytest.approx(ref.layers[0]["bfe"], rel=1e-5)
    assert {s["name"] for s in got.skipped} == {"bias", "parametrizations.weight.original0",
                                                 "parametrizations.weight.original1"}


@pytest.mark.parametrize("drop, left", [
    ("enc.conv.parametrizations.weight.original0", "enc.conv.parametrizations.weight.original1"),
    ("enc.conv.parametrizations.weight.0._u", "enc.conv.parametrizations.weight.original"),
])
def test_a_missing_part_skips_the_rest_saying_so(tmp_path: Path, drop: str, left: str) -> None:
    key = "weight_norm_dim2" if "original0" in drop else "spectral_norm"
    path = _save(_trained(key), tmp_path / "m.pt")
    state = torch.load(path)
    del state[drop]
    torch.save(state, path)
    with open_source(path) as source:
        listed = {entry.name: why for entry, why in entries(source)}
    assert "enc.conv.weight" not in listed
    assert listed[left] is not None and listed[left].startswith("part of enc.conv.weight, which wbfe cannot compose")


def test_parts_that_do_not_fit_are_skipped(tmp_path: Path) -> None:
    save_file({"c.weight_g": torch.ones(3, 2), "c.weight_v": torch.randn(4, 6)}, str(tmp_path / "m.safetensors"))
    with open_source(tmp_path / "m.safetensors") as source:
        listed = {entry.name: why for entry, why in entries(source)}
    assert listed == {name: "part of c.weight, which wbfe cannot compose: magnitude g [3, 2] fits no dim of "
                      "direction v [4, 6]; not scored" for name in ("c.weight_g", "c.weight_v")}


def test_an_edit_refuses_a_composed_weight(tmp_path: Path) -> None:
    path = _save(_trained("weight_norm_dim2"), tmp_path / "m.safetensors")
    out = tmp_path / "out.safetensors"
    with pytest.raises(UnsupportedDtypeError) as info:
        smooth_checkpoint(path, out)
    assert str(info.value) == ("enc.conv.weight: stored as the parts torch composes it from (weight-norm-dim2); "
                               "editing writes plain tensors and would not write it back as its parts")
    from typer.testing import CliRunner

    from wbfe_cli.main import app

    for command in (["smooth", str(path), str(out)], ["prune", str(path), str(out), "--target", "0.5"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        assert "enc.conv.weight: stored as the parts torch composes it from" in result.output
    assert not out.exists()


def test_compare_compares_the_composed_weights(tmp_path: Path) -> None:
    # The same layer stored by the legacy and the parametrizations weight norm: one weight, unchanged.
    new = _trained("weight_norm_dim2")
    legacy = MODULES["legacy_weight_norm"]()
    with torch.no_grad():
        legacy.weight_g.copy_(new.parametrizations.weight.original0 * 3)
        legacy.weight_v.copy_(new.parametrizations.weight.original1 / 2)
    result = wbfe.compare(_save(new, tmp_path / "a.safetensors"), _save(legacy, tmp_path / "b.bin"))
    assert [row["name"] for row in result.layers] == ["enc.conv.weight"]
    assert result.layers[0]["rel_frobenius"] == pytest.approx(2.0, rel=1e-5)  # B = 3·A: v halved, g tripled


def test_weight_u_and_weight_v_alone_are_no_parts(tmp_path: Path) -> None:
    # Without weight_g or weight_orig beside them they are not torch's parts of a weight: planned as any tensor.
    save_file({"c.weight_u": torch.randn(8, 3), "c.weight_v": torch.randn(3, 6)}, str(tmp_path / "m.safetensors"))
    assert [layer["name"] for layer in wbfe.score(tmp_path / "m.safetensors").layers] == ["c.weight_u", "c.weight_v"]


def test_a_zero_direction_or_sigma_is_non_finite_as_in_the_model(tmp_path: Path) -> None:
    # torch's module.weight is NaN where v is zero (0/0) and infinite where σ = 0: skipped for it, never a number.
    v = torch.randn(6, 5)
    v[2] = 0
    save_file({"c.weight_g": torch.ones(6, 1), "c.weight_v": v, "d.weight_orig": torch.randn(4, 3),
               "d.weight_u": torch.zeros(4), "d.weight_v": torch.zeros(3), "e.weight": torch.randn(5, 4)},
              str(tmp_path / "m.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nor a numpy warning on the way
        result = wbfe.score(tmp_path / "m.safetensors")
    assert [layer["name"] for layer in result.layers] == ["e.weight"]
    skipped = {s["name"]: s["reason"] for s in result.skipped}
    assert skipped["c.weight"] == skipped["d.weight"] == "non-finite values (NaN or Inf)"


@pytest.mark.parametrize("transposed", [False, True])
def test_square_convolution_needs_its_description(tmp_path: Path, transposed: bool) -> None:
    # u [8] fits dims 0 and 1 of a [8, 8, 3, 3] kernel: torch normalises a convolution along 0, a transposed one along
    # 1; the module says which it is, a bare state dict does not.
    torch.manual_seed(0)
    module = P.spectral_norm((torch.nn.ConvTranspose2d if transposed else torch.nn.Conv2d)(8, 8, 3))
    module(torch.randn(2, 8, 6, 6))
    module.eval()
    with open_source(module) as source:
        listed = {entry.name: (entry, why) for entry, why in entries(source)}
    entry, why = listed["weight"]
    assert why is None and entry.quant == f"spectral-norm-dim{int(transposed)}"
    assert entry.layout == ("in_out" if transposed else "out_in")
    np.testing.assert_allclose(entry.load(), module.weight.detach().double().numpy(), rtol=1e-5, atol=1e-7)
    with open_source(_save(module, tmp_path / "m.safetensors")) as source:
        listed = {entry.name: (entry, why) for entry, why in entries(source)}
    assert "enc.conv.weight" not in listed
    assert listed["enc.conv.parametrizations.weight.original"][1] == (
        "part of enc.conv.weight, which wbfe cannot compose: vector u [8] fits dims [0, 1] of the weight [8, 8, 3, 3]: "
        "torch takes 0 for a convolution, 1 for a transposed one, and the checkpoint does not say which it is; not "
        "scored")


def test_stacked_parametrizations_are_skipped(tmp_path: Path) -> None:
    # weight norm, then spectral norm on its result: original0, original1 and 1._u, 1._v compose no one rule wbfe has
    module = P.spectral_norm(P.weight_norm(torch.nn.Linear(6, 5)))
    result = wbfe.score({"x": torch.randn(4, 3), **{"s." + k: v for k, v in module.state_dict().items()}})
    assert [layer["name"] for layer in result.layers] == ["x"]
    skipped = {s["name"]: s["reason"] for s in result.skipped}
    reason = ("part of s.weight, which wbfe cannot compose: its stored parts (s.parametrizations.weight.1._u, "
              "s.parametrizations.weight.1._v, s.parametrizations.weight.original0, "
              "s.parametrizations.weight.original1) are neither weight norm's (g, v) nor spectral norm's (weight, u, "
              "v); not scored")
    assert {name: skipped[name] for name in skipped if "parametrizations" in name} == {
        f"s.parametrizations.weight.{part}": reason for part in ("original0", "original1", "1._u", "1._v")}
