"""The data-free stopping rules (wbfe.watch.stopping), their leave-one-run-out measurement, the shipped table,
``wbfe watch`` with no options / ``--rule``, and accuracy as the only test metric."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wbfe.errors import InvalidOptionError
from wbfe.watch.stopping import RULES, RunSignals, apply_rule, detect_regime, evaluate_rules, shipped_table
from wbfe.watch.trajectories import CheckpointPoint, LayerPoint, Trajectory
from wbfe_cli.main import app

REPO = Path(__file__).resolve().parents[1]


def signals(series: dict[str, list[float]], log_ratio: list[list[float]] | None = None,
            lam_first: list[float] | None = None, name: str = "r") -> RunSignals:
    n = len(next(iter(series.values())))
    ratio = np.array(log_ratio if log_ratio is not None else [[math.nan]] * n, dtype=float)
    return RunSignals(name, tuple(range(n)), {k: np.array(v, dtype=float) for k, v in series.items()}, ratio,
                      np.array(lam_first or [1.0] * ratio.shape[1]), np.ones(ratio.shape[1]))


# --- the rule forms, on series with known answers ---------------------------------------------------------

def test_fraction_plateau_extremes_and_alpha() -> None:
    sig = signals({"log_norm": [0.0, 1.0, 3.0, 4.0], "alpha": [3.0, 2.5, 1.9, 1.5], "bfe_last": [2, 1, 1.5, 3]})
    # done = [0, .25, .75, 1]: 70 % is first reached at index 2, 95 % at the last.
    assert apply_rule(sig, "log_norm_frac", 0.7)[0] == 2
    assert apply_rule(sig, "log_norm_frac", 0.95)[0] == 3
    assert apply_rule(sig, "alpha_cross2", None) == (2, "first checkpoint with mean α ≤ 2 (1.9)")
    assert apply_rule(sig, "bfe_last_min", None)[0] == 1
    assert apply_rule(sig, "log_norm_max", None)[0] == 3
    assert apply_rule(sig, "last", None)[0] == 3
    # step changes 4, 2, 1, 0.2: at q = 0.3 (threshold 1.2) the first small change ends at index 3.
    plateau = signals({"log_norm": [0.0, 4.0, 6.0, 7.0, 7.2]})
    assert apply_rule(plateau, "log_norm_plateau", 0.3)[0] == 3
    assert apply_rule(plateau, "log_norm_plateau", 0.02)[0] == 4  # never that flat: the last
    flat = signals({"log_norm": [1.0, 1.0, 1.0]})
    assert apply_rule(flat, "log_norm_frac", 0.5) == (2, "log_norm does not change over the run: the last checkpoint "
                                                         "is kept")
    missing = signals({"alpha": [3.0, 2.5, 2.1]})
    assert apply_rule(missing, "alpha_cross2", None)[0] == 2  # never ≤ 2: the last
    assert apply_rule(missing, "rand_distance_min", None)[1] == ("rand_distance is not finite at every checkpoint: "
                                                                 "the last checkpoint is kept")


def test_rules_with_a_parameter_need_it_and_unknown_rules_are_refused() -> None:
    sig = signals({"log_norm": [0.0, 1.0]})
    with pytest.raises(InvalidOptionError, match="rule log_norm_frac needs its parameter"):
        apply_rule(sig, "log_norm_frac")
    with pytest.raises(InvalidOptionError, match="no_such_rule"):
        apply_rule(sig, "no_such_rule")


def _layer(kappa: float, beta: float, lam_star: float, **extra: float) -> LayerPoint:
    return LayerPoint(name="fc.weight", role="", gamma=0.25, kappa=kappa, beta=beta, tau=0.5, ks=0.0, bfe_opt=1.0,
                      lambda_star=lam_star, alpha=3.0, n_eigs=64, extra=dict(extra))


def test_h_star_first_is_h_at_most_h_star_at_the_first_lambda_star() -> None:
    """The paper's rule at the λ where h = h*(λ) at the first checkpoint, checked against LayerPoint.h_star(λ)."""
    betas = [1.0, 0.8, 0.7, 0.9, 1.1, 1.5]  # h/h*(1) = 4/β + 0.5 falls below its first value 4.5 at index 4
    traj = Trajectory("r", [CheckpointPoint(t, "s", (_layer(2.0, b, 0.7, log_norm=float(-t)),), min_eigs=10)
                            for t, b in enumerate(betas)])
    from wbfe.watch.stopping import run_signals

    sig = run_signals(traj)
    first = traj.points[0].layers[0]
    lam = first.h_star(1.0) / first.h  # h = h*(λ) at the first checkpoint
    direct = next(t for t in range(1, len(betas))
                  if traj.points[t].layers[0].h <= traj.points[t].layers[0].h_star(lam))
    assert direct == 4 and apply_rule(sig, "h_star_first", None)[0] == direct
    assert detect_regime(sig) == "shrinking"  # log-norm falls from the first trained checkpoint on


def test_detect_regime_reads_the_norm_trend_after_the_initialisation() -> None:
    # The initialisation's scale is the initialiser's: a fall from it and a rise after it is "growing".
    assert detect_regime(signals({"log_norm": [5.0, 1.0, 1.5, 2.0]})) == "growing"
    assert detect_regime(signals({"log_norm": [1.0, 3.0, 2.5, 2.0]})) == "shrinking"


# --- leave-one-run-out ------------------------------------------------------------------------------------

def _runs() -> tuple[list[RunSignals], list[np.ndarray]]:
    """Runs whose lowest test loss is exactly where log_norm has made 80 % of its change."""
    sigs, losses = [], []
    for r, n in enumerate((6, 8, 10, 7)):
        done = np.linspace(0, 1, n) ** (0.5 + 0.3 * r)
        best = int(np.argmax(done >= 0.8))
        sigs.append(signals({"log_norm": list(2.0 + 3.0 * done)}, name=f"r{r}"))
        losses.append(0.3 + 0.05 * np.abs(np.arange(n) - best))
    return sigs, losses


def test_leave_one_run_out_against_a_brute_force_reference() -> None:
    sigs, losses = _runs()
    scores = evaluate_rules(sigs, losses, ["last", "log_norm_frac", "log_norm_max"])
    np.testing.assert_allclose(scores["last"].regret, [x[-1] - x.min() for x in losses])
    np.testing.assert_allclose(scores["log_norm_max"].regret, scores["last"].regret)  # the max is the last
    # Brute force: for each held-out run, the grid value with the lowest mean regret on the others
    # (ties: the middle of the tied set), applied to it.
    grid = RULES["log_norm_frac"].grid
    for r in range(len(sigs)):
        means = []
        for q in grid:
            regrets = [losses[i][apply_rule(sigs[i], "log_norm_frac", q)[0]] - losses[i].min()
                       for i in range(len(sigs)) if i != r]
            means.append(np.mean(regrets))
        tied = [k for k, m in enumerate(means) if m <= min(means) + 1e-12]
        q = grid[tied[len(tied) // 2]]
        t = apply_rule(sigs[r], "log_norm_frac", q)[0]
        assert scores["log_norm_frac"].chosen[r] == t
    assert np.all(scores["log_norm_frac"].regret == 0.0)  # q = 0.8 lies in the grid
    assert scores["log_norm_frac"].param_all == 0.8
    assert scores["log_norm_frac"].hit.all()
    assert list(scores["last"].hit) == [abs(x.size - 1 - int(np.argmin(x))) <= 1 for x in losses]


def test_evaluation_needs_runs_with_test_losses() -> None:
    sigs, losses = _runs()
    with pytest.raises(InvalidOptionError, match="at least two runs"):
        evaluate_rules(sigs[:1], losses[:1])
    with pytest.raises(InvalidOptionError, match="run r1: every checkpoint needs a finite test loss"):
        evaluate_rules(sigs[:2], [losses[0], np.full(8, np.nan)])


# --- the shipped table ------------------------------------------------------------------------------------

def test_shipped_table_is_generated_from_the_benchmark_result() -> None:
    import sys

    sys.path.insert(0, str(REPO))
    from benchmarks.bench_early_stopping import RESULT, _jsonable, shipped

    if not RESULT.is_file():
        pytest.skip("benchmarks/results/early_stopping.json not generated")
    result = json.loads(RESULT.read_text())
    table = shipped_table()
    assert table == json.loads(json.dumps(_jsonable(shipped(result))))
    assert set(table["rules"]) == set(RULES)
    best = min(v["regret_mean"] for v in table["rules"].values())
    last, auto = table["keep_last"]["regret_mean"], table["auto_selection"]["regret_mean"]
    if table["default"] == "last":  # no rule beat it, or choosing the rule on the other runs did not
        assert best >= last - 1e-12 or auto >= last - 1e-12
    else:
        assert table["rules"][table["default"]]["regret_mean"] == best < last and auto < last


def test_the_page_is_generated_from_the_benchmark_result() -> None:
    import sys

    sys.path.insert(0, str(REPO / "benchmarks" / "early_stopping"))
    from make_doc import DOC, RESULT, render

    if not RESULT.is_file():
        pytest.skip("benchmarks/results/early_stopping.json not generated")
    result = json.loads(RESULT.read_text())
    assert DOC.read_text() == render(result)
    # Every figure comes from the JSON: another keep-the-last regret shows up in the page.
    result["baselines"]["last"]["all"]["regret_mean"] = 9.8765
    assert "9.8765" in render(result)


# --- the recommendation, the CLI, accuracy alone ----------------------------------------------------------

def _table(default: str) -> dict:
    fig = {"n": 3, "regret_mean": 0.05, "regret_median": 0.01, "hit_rate": 2 / 3, "better_than_last": 2,
           "worse_than_last": 0}
    rules = {name: {"description": RULES[name].description, "param": None, **fig} for name in ("last", "log_norm_max")}
    rules["last"]["regret_mean"] = 0.2
    rules["log_norm_max"]["regret_mean"] = 0.3 if default == "last" else 0.05
    return {"runs": 3, "layers": "fittable", "default": default, "keep_last": {**fig, "regret_mean": 0.2},
            "validation_oracle": {**fig, "regret_mean": 0.001}, "rules": rules}


def _accuracy_run(tmp_path: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    base = torch.randn(40, 30, generator=g)
    for t, scale in enumerate((1.0, 3.0, 2.0, 1.5)):  # the norm peaks at step 1
        save_file({"fc.weight": base * scale}, str(tmp_path / f"epoch_{t}.safetensors"))
    (tmp_path / "metrics.csv").write_text("step,test_accuracy\n0,0.5\n1,0.8\n2,0.7\n3,0.6\n")
    return tmp_path


def test_accuracy_alone_is_compared_and_plotted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wbfe.reporting.plots import watch as plots
    from wbfe.watch import trajectory
    from wbfe.watch.decide import result_by_rule

    traj = trajectory(_accuracy_run(tmp_path), layers="all", device="cpu")
    result = result_by_rule(traj, "last", layers="all", table=_table("log_norm_max"))
    comp = result.comparison()
    assert comp is not None and comp["metric"] == "test_accuracy"
    assert (comp["best_step"], comp["recommended_step"]) == (1, 3)
    assert comp["test_accuracy_gap"] == pytest.approx(0.2)
    assert "best test accuracy at step 1 (0.8000); recommended: 0.6000 (gap +0.2000; no test loss given)" \
        in result.table()
    captured = []
    monkeypatch.setattr(plots, "save", lambda fig, path, dpi: captured.append(fig) or Path(path))
    plots.plot_watch(result, tmp_path / "w.png")
    ax = captured[0].axes[3]
    assert ax.get_title() == "test metrics (accuracy; no test loss given)"
    assert not [t for t in ax.texts if "no test metrics" in t.get_text()]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.5, 0.8, 0.7, 0.6])


def test_rule_decides_and_says_how_far_to_trust_it(tmp_path: Path) -> None:
    from wbfe.watch import trajectory
    from wbfe.watch.decide import result_by_rule

    traj = trajectory(_accuracy_run(tmp_path), layers="all", device="cpu")
    chosen = result_by_rule(traj, None, layers="all", table=_table("log_norm_max"))
    assert chosen.recommendation is not None and chosen.recommendation.step == 1  # the norm's peak
    lines = chosen.stopping["lines"] if chosen.stopping else []
    assert lines[0].startswith("log_norm_max (default: the lowest held-out regret)")
    assert lines[1] == ("held out on 3 measured runs: mean regret 0.0500 (median 0.0100), hit rate 67%; keep the "
                        "last: mean regret 0.2000 (median 0.0100), hit rate 67%; validation-set oracle: mean regret "
                        "0.0010 (median 0.0100), hit rate 67% (regret = test loss − the run's lowest)")
    assert lines[2] == "note: measured with --layers fittable; this run used --layers all"
    kept = result_by_rule(traj, None, layers="fittable", table=_table("last"))
    assert kept.recommendation is not None and kept.recommendation.step == 3
    assert kept.stopping is not None and kept.stopping["lines"][0] == (
        "keep the last checkpoint — no data-free rule beat it on 3 held-out runs (best single rule: log_norm_max, "
        "mean regret 0.3000 against 0.2000); choose another with --rule NAME")
    # The best rule beats the last held out, but choosing it on the other runs did not: the nested figure is said.
    nested = _table("last")
    nested["rules"]["log_norm_max"]["regret_mean"] = 0.1
    nested["auto_selection"] = {**nested["keep_last"], "regret_mean": 0.25}
    kept = result_by_rule(traj, None, layers="fittable", table=nested)
    assert kept.stopping is not None and kept.stopping["lines"][0] == (
        "keep the last checkpoint — no data-free rule beat it on 3 held-out runs (best single rule: log_norm_max, "
        "mean regret 0.1000 against 0.2000, but a rule chosen on the other runs, applied to the held-out one, "
        "0.2500); choose another with --rule NAME")
    data = json.loads(kept.to_json())
    assert data["recommended"] == {"step": 3, "rule": "last", "reason": "keep the last checkpoint"}


def test_cli_default_rule_and_rule_option(tmp_path: Path) -> None:
    run = _accuracy_run(tmp_path)
    table = shipped_table()
    out = CliRunner().invoke(app, ["watch", str(run), "-f", "json", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    rule = data["stopping_rule"]
    assert rule["name"] == table["default"] and rule["default"] is True
    assert rule["held_out"]["regret_mean"] == table["rules"][table["default"]]["regret_mean"]
    assert data["layer_selection"] == "fittable"
    last = CliRunner().invoke(app, ["watch", str(run), "--rule", "last", "--device", "cpu"])
    assert last.exit_code == 0, last.output
    assert "recommended step: 3 — keep the last checkpoint" in last.stdout
    assert "rule: last (chosen with --rule)" in last.stdout
    bad = CliRunner().invoke(app, ["watch", str(run), "--rule", "nope"])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1 and "nope" in bad.stderr
    both = CliRunner().invoke(app, ["watch", str(run), "--rule", "last", "--lambda", "1"])
    assert both.stderr.strip() == ("wbfe: error: give either --rule NAME or --lambda / --calibrate (the h* rule at a "
                                   "λ), not both")


def test_vote_is_the_median_of_its_three_rules() -> None:
    sig = signals({"log_norm": [0.0, 4.0, 6.0, 6.1, 6.2], "bfe_last": [3.0, 2.0, 1.0, 2.0, 3.0]},
                  log_ratio=[[0.5], [0.2], [0.1], [-0.1], [-0.2]])
    param = {"h_star_loo": 1.0, "log_norm_plateau": 0.3}
    # h_star_loo at λ = 1: first log ratio ≤ 0 at index 3; bfe_last_min: index 2; plateau (steps 4, 2, .1, .1): 3.
    assert [apply_rule(sig, n, param.get(n))[0] for n in ("h_star_loo", "bfe_last_min", "log_norm_plateau")] == [3, 2, 3]
    assert apply_rule(sig, "vote", param) == (3, "median of h_star_loo: step 3, bfe_last_min: step 2, "
                                                 "log_norm_plateau: step 3")


def test_gated_follows_the_regime_of_the_weights() -> None:
    param = {"shrinking": ["log_norm_min", None], "growing": ["last", None]}
    falling, rising = signals({"log_norm": [5.0, 4.0, 3.0, 2.0]}), signals({"log_norm": [1.0, 2.0, 2.5, 2.4]})
    assert apply_rule(falling, "gated", param) == (3, "norms shrinking → log_norm_min: lowest log_norm of the run (2)")
    assert apply_rule(rising, "gated", param)[0] == 3 and apply_rule(rising, "gated", param)[1].startswith(
        "norms growing → last: ")
    assert detect_regime(signals({"alpha": [3.0, 2.0]})) == "growing"  # no log-norm to read: the default


def test_the_composites_and_the_whole_procedure_held_out() -> None:
    """On runs whose lowest loss is where log_norm has made 80 % of its change, log_norm_frac at 0.8 is the only
    rule with no regret: gated picks it in both regimes, and the nested procedure (ties by name) picks gated. The
    vote's other two voters have nothing to read here (no h/h*, no BFE-W) and keep the last checkpoint."""
    from wbfe.watch.stopping import select_held_out

    sigs, losses = _runs()
    best, last = [int(np.argmin(x)) for x in losses], [x.size - 1 for x in losses]
    scores = evaluate_rules(sigs, losses, ["gated", "vote"])
    assert scores["gated"].param_all == {"shrinking": ["log_norm_frac", 0.8], "growing": ["log_norm_frac", 0.8]}
    assert list(scores["gated"].chosen) == best and not scores["gated"].regret.any()
    assert list(scores["vote"].chosen) == last
    np.testing.assert_allclose(scores["vote"].regret, [x[-1] - x.min() for x in losses])
    picks, auto = select_held_out(sigs, losses)
    assert picks == ["gated"] * len(sigs) and list(auto.chosen) == best and auto.hit.all()


def test_edge_cases_of_the_rule_forms_and_the_signals_round_trip() -> None:
    flat = signals({"log_norm": [1.0, 1.0, 1.0]})
    assert apply_rule(flat, "log_norm_plateau", 0.3) == (2, "log_norm does not change over the run: the last "
                                                            "checkpoint is kept")
    never = signals({"log_norm": [0.0, 1.0]}, log_ratio=[[0.5], [0.2]])
    assert apply_rule(never, "h_star_loo", 1.0) == (1, "h > h*(λ) at every checkpoint (λ = 1; last median h/h* = "
                                                       "1.22): never crossed, the last checkpoint is kept")
    sig = signals({"log_norm": [0.0, math.nan, 2.0]}, log_ratio=[[0.5, math.nan], [0.2, 0.1], [-0.1, 0.0]])
    back = RunSignals.from_dict(json.loads(json.dumps(sig.to_dict())))  # NaN travels as null
    assert (back.name, back.steps) == (sig.name, sig.steps)
    for a, b in [(back.series["log_norm"], sig.series["log_norm"]), (back.log_ratio, sig.log_ratio),
                 (back.lam_first, sig.lam_first), (back.lam_fanin, sig.lam_fanin)]:
        np.testing.assert_array_equal(a, b)
