"""wbfe.watch.guidance on a real (tiny) training run: why h is NaN on a 7-class head, which layers can
carry h_t, and BFE-W at a fixed λ across the run, recomputed from the eigenvalues with wbfe.metrics.bfe."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wbfe.metrics.bfe import bfe, lambda_star
from wbfe.watch.guidance import bfe_at, bfe_at_many, describe_trend, fixed_lambda_trend

EPOCHS = 4
REASON = "too few eigenvalues for a tail fit: 7 < min_eigs=10"


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded 32-64-48-7 MLP trained with SGD, one safetensors file per epoch."""
    import torch
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("mlp_run")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=gen)
    y = torch.randint(0, 7, (256,), generator=gen)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48), torch.nn.ReLU(),
                                torch.nn.Linear(48, 7))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for epoch in range(EPOCHS):
        for i in range(0, 256, 32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
            opt.step()
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
                  str(folder / f"epoch_{epoch}.safetensors"))
    return folder


def gram_eigs(folder: Path, epoch: int, name: str) -> np.ndarray:
    """The eigenvalues of the smaller Gram matrix of one tensor, in float64 (independent of wbfe's reader)."""
    from safetensors.numpy import load_file

    w = load_file(str(folder / f"epoch_{epoch}.safetensors"))[name].astype(np.float64)
    g = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    return np.linalg.eigvalsh(g)


def test_bfe_at_many_and_describe_trend() -> None:
    f = np.array([[1.0, 2.0]])
    ls = np.array([[2.0, 0.5]])
    got = bfe_at_many(f, ls, np.array([[4.0, 0.5]]))
    assert got[0, 0] == pytest.approx(bfe_at(1.0, 2.0, 4.0)) and got[0, 1] == 2.0
    assert math.isnan(bfe_at_many(np.array([1.0]), np.array([math.nan]), np.array([1.0]))[0])
    assert describe_trend([0, 1, 2], np.array([3.0, 2.0, 2.5])) == "step 0 3 → step 2 2.5 (-0.5; falls at 1 of 2 steps)"
    assert describe_trend([5], np.array([1.0])) == "step 5: 1 (one checkpoint)"
    assert describe_trend([5], np.array([math.nan])) == "no finite value"


def test_fixed_lambda_is_each_layers_last_finite_lambda_star() -> None:
    ls = np.array([[1.0, 3.0], [2.0, math.nan]])
    trend = fixed_lambda_trend([10, 20], ["a", "b"], np.ones((2, 2)), ls)
    assert trend.lambdas == {"a": 2.0, "b": 3.0} and trend.source == "last checkpoint" and trend.source_step == 20
    # at its own λ* a layer's fixed-λ value is F* itself; the run mean keeps the layers finite throughout (a only)
    assert trend.bfe[1, 0] == 1.0 and trend.bfe[0, 1] == 1.0
    assert trend.run_bfe[1] == 1.0 and trend.run_bfe[0] == pytest.approx(bfe_at(1.0, 1.0, 2.0))
    given = fixed_lambda_trend([10, 20], ["a", "b"], np.ones((2, 2)), ls, lam=0.5)
    assert given.lambdas == {"a": 0.5, "b": 0.5} and given.source == "given" and given.source_step is None


def test_seven_class_head_says_why_and_offers_the_fittable_layers(mlp_run: Path) -> None:
    from wbfe.watch import watch

    result = watch(mlp_run)
    data = result.to_dict()
    assert data["notes"] == [
        f"[1] 4.weight ({EPOCHS} of {EPOCHS} checkpoints): htmp_kappa, htmp_beta, htmp_tau, h, h_star, f_inf, alpha "
        f"are NaN — {REASON}"]
    assert data["hint"] == ("too few eigenvalues for an HTMP fit (4.weight has 7; the fit needs min_eigs=10); "
                            "the matrices that can carry h_t: 0.weight (32), 2.weight (48) — rerun with --layers fittable")
    assert [r["note"] for r in result.rows()] == ["[1]"] * EPOCHS
    table = result.table()
    assert data["notes"][0] in table and f"hint: {data['hint']}" in table
    assert "no selected layer has a finite h/h*: see the notes above" in table
    assert "not expected to fall over one run's epochs" in table
    assert data["recommended"]["reason"].startswith("no lambda given: pass --lambda FLOAT or --lambda calibrated")


def test_fixed_lambda_bfe_matches_the_eigenvalues(mlp_run: Path) -> None:
    from wbfe.watch import watch

    data = watch(mlp_run).to_dict()
    fixed = data["bfe_fixed_lambda"]
    lam = lambda_star(gram_eigs(mlp_run, EPOCHS - 1, "4.weight"))  # the head's λ* at the last checkpoint
    assert fixed["lambda_source"] == "last checkpoint" and fixed["lambda_step"] == EPOCHS - 1
    assert fixed["lambdas"]["4.weight"] == pytest.approx(lam, rel=1e-5)
    want = [bfe(gram_eigs(mlp_run, t, "4.weight"), lam)[0] for t in range(EPOCHS)]
    want_opt = [bfe(gram_eigs(mlp_run, t, "4.weight"))[0] for t in range(EPOCHS)]
    assert [p["bfe"] for p in fixed["trend"]] == pytest.approx(want, rel=1e-5)
    assert [p["bfe_opt"] for p in fixed["trend"]] == pytest.approx(want_opt, rel=1e-5)
    assert [c["layers"][0]["bfe_fixed"] for c in data["checkpoints"]] == pytest.approx(want, rel=1e-5)
    assert fixed["summary"] == describe_trend(list(range(EPOCHS)), np.array([p["bfe"] for p in fixed["trend"]]))
    # a given λ replaces the last checkpoint's
    at_2 = watch(mlp_run, lam=2.0).to_dict()
    assert at_2["recommended"] == {"step": None, "crossed": False, "reason": (
        "no checkpoint has a finite h/h* (no HTMP fit of the selected layers: failed, or too few eigenvalues)")}
    given = at_2["bfe_fixed_lambda"]
    assert given["lambda_source"] == "given"
    assert [p["bfe"] for p in given["trend"]] == pytest.approx(
        [bfe(gram_eigs(mlp_run, t, "4.weight"), 2.0)[0] for t in range(EPOCHS)], rel=1e-5)


def test_fittable_layers_carry_h(mlp_run: Path) -> None:
    from wbfe.metrics import htmp
    from wbfe.watch import watch

    result = watch(mlp_run, layers="fittable")
    assert result.trajectory.layer_names == ["0.weight", "2.weight"]
    data = result.to_dict()
    assert data["notes"] == [] and data["hint"] is None
    for point, sig in zip(result.trajectory.points, data["signal"]):
        # h/h*(1) is the mean of the fitted HTMP law, κ/(2γβ) + τ (wbfe.watch.rule): recomputed per layer
        means = [x.kappa / (2 * x.gamma * x.beta) + x.tau for x in point.layers]
        # the rule's statistic is the median of the logs (two layers: the geometric mean)
        assert sig["h_over_h_star_1"] == pytest.approx(math.exp(float(np.median(np.log(means)))), rel=1e-9)
        assert sig["lambda_c"] == pytest.approx(1.0 / sig["h_over_h_star_1"], rel=1e-12)
        assert all(math.isfinite(x.h) and x.h_star(1.0) == pytest.approx(
            float(htmp.h_star(1.0, x.gamma, kappa=x.kappa, c=x.beta * x.tau))) for x in point.layers)


def test_cli_prints_the_reason_and_the_hint(mlp_run: Path) -> None:
    import wbfe_cli.watch  # noqa: F401 - attaches the command
    from wbfe_cli.main import app

    out = CliRunner().invoke(app, ["watch", str(mlp_run), "--layers", "head"])  # the default is fittable now
    assert out.exit_code == 0, out.output
    assert REASON in out.stdout and "rerun with --layers fittable" in out.stdout
    assert "BFE-W at each layer's λ* at the last checkpoint (step 3): step 0" in out.stdout


def test_plot_draws_the_fixed_lambda_bfe(mlp_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wbfe.reporting.plots.watch as plots
    from wbfe.watch import watch

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path, dpi: figures.append(fig) or Path(path))
    result = watch(mlp_run)
    plots.plot_watch(result, tmp_path / "w.png")
    h_ax, _, bfe_ax, _ = figures[0].axes[:4]
    fixed = result.fixed_lambda()
    solid, dotted = bfe_ax.get_lines()[:2]
    assert np.allclose(solid.get_ydata(), fixed.bfe[:, 0]) and np.allclose(dotted.get_ydata(), fixed.bfe_opt[:, 0])
    assert bfe_ax.get_title() == "BFE-W at the last checkpoint's λ* (dotted: at each λ*)"
    assert [t.get_text() for t in h_ax.texts] == ["no HTMP fit (too few eigenvalues?):\nsee the notes of the table"]


@pytest.mark.parametrize("lambda_star, lam", [(0.0, 1.0), (math.inf, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, -2.0)])
def test_bfe_at_outside_its_domain_is_nan_as_bfe_at_many(lambda_star: float, lam: float) -> None:
    """λ* = 0 raised ZeroDivisionError and λ* = ∞ or λ ≤ 0 ValueError ('math domain error') where the array
    form gives NaN."""
    assert math.isnan(bfe_at(1.0, lambda_star, lam))
    assert math.isnan(bfe_at_many(np.array([1.0]), np.array([lambda_star]), np.array([lam]))[0])
