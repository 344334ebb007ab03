"""wbfe.watch: step parsing and run discovery, the stopping rule, λ calibration, synthetic HTMP runs, the Monitor."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from wbfe.errors import InvalidOptionError, MissingDependencyError, SourceNotFoundError
from wbfe.watch.rule import calibrate_lambda, critical_lambda, layer_statistic, recommend
from wbfe.watch.runs import discover_run, parse_step

# Synthetic HTMP runs: one (P x p) "classifier.weight" per checkpoint whose squared singular
# values are an HTMP sample with κ fixed and β_t rising geometrically, so h_t = κ/β_t falls by a
# factor 2 per checkpoint and crosses h* = 2γ/λ exactly once, between checkpoints K-1 and K.
P_SIDE, p_SIDE = 320, 80
GAMMA = p_SIDE / P_SIDE
KAPPA = 2.0
BETA0, RATE, K_CROSS = 1.0, 2.0, 4


def htmp_module():  # noqa: ANN201
    return pytest.importorskip("wbfe.metrics.htmp", reason="wbfe.metrics.htmp has not landed yet")


def _crossing_lambda() -> float:
    # h* = 2γ/λ at the geometric middle of h_{K-1} and h_K.
    h_mid = KAPPA / (BETA0 * RATE ** (K_CROSS - 0.5))
    return 2.0 * GAMMA / h_mid


def synthetic_weight(eigs: np.ndarray, seed: int) -> np.ndarray:
    """A (p, P) matrix whose Gram-matrix eigenvalues are exactly ``eigs``: U diag(√e) Vᵀ."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((p_SIDE, p_SIDE)))
    v, _ = np.linalg.qr(rng.standard_normal((P_SIDE, p_SIDE)))
    return (u * np.sqrt(eigs)) @ v.T


def write_synthetic_run(folder: Path, *, steps: int = 8, beta0: float = BETA0, seed: int = 0,
                        name: str = "step_{step}.safetensors") -> list[float]:
    """Write checkpoints with β_t = β0·RATE^t; return the true h_t."""
    import torch
    from safetensors.torch import save_file

    htmp = htmp_module()
    folder.mkdir(parents=True, exist_ok=True)
    # One call draws every checkpoint's spectrum (the CDF table is the costly part), at β = 1:
    # a draw at rate β is the draw at rate 1 divided by β.
    unit = np.asarray(htmp.sample(p_SIDE * steps, KAPPA, GAMMA, 1.0, seed=seed), dtype=float).reshape(steps, p_SIDE)
    hs = []
    for t in range(steps):
        beta = beta0 * RATE**t
        w = synthetic_weight(np.sort(unit[t]) / beta, seed * 100 + t)
        save_file({"classifier.weight": torch.from_numpy(w).float()}, str(folder / name.format(step=t * 100)))
        hs.append(KAPPA / beta)
    return hs


def touch_weights(path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"classifier.weight": torch.eye(12)}, str(path))


# --- step parsing and run discovery -------------------------------------------------------------

@pytest.mark.parametrize("name, step", [
    ("epoch_9", 9), ("epoch_10", 10), ("step-1000", 1000), ("ckpt_00020.pt", 20), ("checkpoint-500/", 500),
    ("checkpoint-500", 500), ("step1000", 1000), ("global_step200.ckpt", 200), ("run3_epoch_7.safetensors", 7),
    ("model_epoch3_step1200.bin", 1200), ("weights-17.pth", 17), ("step-0", 0), ("model.safetensors", None),
])
def test_parse_step(name: str, step: int | None) -> None:
    assert parse_step(name) == step


def test_folder_order_is_numeric_over_files_and_folders(tmp_path: Path) -> None:
    for name in ("epoch_10.safetensors", "epoch_9.safetensors", "ckpt_00020.safetensors", "step-1000.safetensors",
                 "checkpoint-500/model.safetensors", "epoch_2.safetensors"):
        touch_weights(tmp_path / name)
    (tmp_path / "README.md").write_text("not a checkpoint")
    (tmp_path / "logs").mkdir()
    run = discover_run(tmp_path)
    assert [c.step for c in run.checkpoints] == [2, 9, 10, 20, 500, 1000]
    assert [Path(str(c.ref)).name for c in run.checkpoints] == [
        "epoch_2.safetensors", "epoch_9.safetensors", "epoch_10.safetensors", "ckpt_00020.safetensors",
        "checkpoint-500", "step-1000.safetensors"]
    assert not run.has_test_loss


def test_folder_metrics_csv_attaches_test_metrics(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        touch_weights(tmp_path / f"epoch_{step}.safetensors")
    (tmp_path / "metrics.csv").write_text("step,test_loss,test_accuracy\n3,0.5,80\n1,0.9,60\n2,0.4,85\n")
    run = discover_run(tmp_path)
    assert [(c.step, c.test_loss, c.test_accuracy) for c in run.checkpoints] == [(1, 0.9, 60.0), (2, 0.4, 85.0),
                                                                                (3, 0.5, 80.0)]
    assert run.has_test_loss


def test_run_csv_with_checkpoint_column_and_hub_ids(tmp_path: Path) -> None:
    touch_weights(tmp_path / "a" / "w.safetensors")
    (tmp_path / "run.csv").write_text("step,checkpoint,test_loss\n20,org/model@step20,0.3\n10,a/w.safetensors,0.5\n")
    run = discover_run(tmp_path / "run.csv")
    assert [(c.step, c.ref, c.test_loss) for c in run.checkpoints] == [
        (10, str(tmp_path / "a" / "w.safetensors"), 0.5), (20, "org/model@step20", 0.3)]


def test_run_csv_without_checkpoint_column_finds_files_beside_it(tmp_path: Path) -> None:
    for step in (5, 15):
        touch_weights(tmp_path / f"step-{step}.safetensors")
    (tmp_path / "m.csv").write_text("step,test_loss\n15,0.2\n5,0.6\n")
    run = discover_run(tmp_path / "m.csv")
    assert [(c.step, Path(str(c.ref)).name) for c in run.checkpoints] == [(5, "step-5.safetensors"),
                                                                          (15, "step-15.safetensors")]


def test_hub_revision_list() -> None:
    run = discover_run("org/name@step3000,org/name@step1000, org/name@step2000")
    assert [(c.step, c.ref) for c in run.checkpoints] == [
        (1000, "org/name@step1000"), (2000, "org/name@step2000"), (3000, "org/name@step3000")]
    assert run.name == "org/name"


@pytest.mark.parametrize("setup, error, message", [
    (lambda d: None, SourceNotFoundError, "{d}: no checkpoints found"),
    (lambda d: touch_weights(d / "final.safetensors"), InvalidOptionError,
     "{d}: cannot parse a step from final.safetensors (put the step in the name, e.g. epoch_3.pt, "
     "or list the checkpoints in a CSV with a step column)"),
    (lambda d: (touch_weights(d / "epoch_3.safetensors"), touch_weights(d / "step-3.safetensors")),
     InvalidOptionError, "{d}: two checkpoints have step 3 (epoch_3.safetensors and step-3.safetensors); "
     "pass --step-pattern REGEX (its first group is the step, e.g. 'epoch(\\d+)'), or list the checkpoints in a "
     "run CSV with step and checkpoint columns"),
])
def test_bad_folders(tmp_path: Path, setup, error: type, message: str) -> None:  # noqa: ANN001
    setup(tmp_path)
    with pytest.raises(error) as info:
        discover_run(tmp_path)
    assert str(info.value) == message.format(d=tmp_path)


def test_bad_csv_and_revisions(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("epoch,test_loss\n1,0.5\n")
    with pytest.raises(InvalidOptionError, match="a run CSV needs a 'step' column"):
        discover_run(tmp_path / "a.csv")
    (tmp_path / "b.csv").write_text("step,test_loss\n1.5,0.5\n")
    with pytest.raises(InvalidOptionError, match=r"step '1.5' is not an integer"):
        discover_run(tmp_path / "b.csv")
    with pytest.raises(InvalidOptionError, match="cannot parse a step from the revision of 'org/m@main'"):
        discover_run("org/m@main,org/m@step2")
    with pytest.raises(SourceNotFoundError):
        discover_run(tmp_path / "missing")


@pytest.mark.parametrize("make, kind", [(lambda p: p.mkdir(), "a folder"),
                                        (lambda p: os.mkfifo(p), "not a regular file"),
                                        (lambda p: p.symlink_to(p.parent / "gone.csv"), "a broken link")])
def test_a_metrics_csv_that_is_not_a_file_is_refused(tmp_path: Path, make, kind: str) -> None:  # noqa: ANN001
    """A metrics.csv folder or FIFO in a run folder was skipped: the run came back with no test losses."""
    for step in (1, 2):
        touch_weights(tmp_path / f"step-{step}.safetensors")
    make(tmp_path / "metrics.csv")
    with pytest.raises(InvalidOptionError) as info:
        discover_run(tmp_path)
    assert str(info.value) == (f"{tmp_path / 'metrics.csv'} is {kind}: a run's metrics.csv must be a CSV file; "
                               "replace or remove it")


def test_a_revision_list_of_two_repos_is_refused() -> None:
    """org/a@step1,org/b@step2 was taken as one run named 'org/a,org/b': two models' checkpoints compared as steps."""
    with pytest.raises(InvalidOptionError) as info:
        discover_run("org/a@step1,org/b@step2")
    assert str(info.value) == ("a revision list names two repos (org/a and org/b): a run is one model's checkpoints; "
                               "for checkpoints in several repos, list them in a run CSV with step and checkpoint "
                               "columns")
    assert discover_run("Org/A@step1,org/a@step2").name == "Org/A"  # the hub matches repo ids without case


@pytest.mark.parametrize("table, message", [
    ("step,val_loss,val_accuracy\n1,0.5,0.8\n2,0.4,0.9\n",
     "{d}: a run's metrics.csv needs a 'test_loss' or 'test_accuracy' column (found: step, val_loss, val_accuracy)"),
    ("step,test_loss\n100,0.5\n200,0.4\n300,0.45\n",
     "{d}: no row is at the step of a checkpoint (rows: steps 100 to 300; checkpoints: steps 1 to 2); write the "
     "checkpoints' steps in the 'step' column"),
])
def test_a_metrics_csv_that_gives_no_checkpoint_a_metric_is_refused(tmp_path: Path, table: str, message: str) -> None:
    """Both were read and none of it used: the run came back without test metrics (and no comparison)."""
    for step in (1, 2):
        touch_weights(tmp_path / f"epoch_{step}.safetensors")
    (tmp_path / "metrics.csv").write_text(table)
    with pytest.raises(InvalidOptionError) as info:
        discover_run(tmp_path)
    assert str(info.value) == message.format(d=tmp_path / "metrics.csv")
    (tmp_path / "metrics.csv").write_text("step,test_loss\n2,0.4\n3,0.3\n")  # rows at other steps too: kept
    losses = [c.test_loss for c in discover_run(tmp_path).checkpoints]
    assert math.isnan(losses[0]) and losses[1] == 0.4


def test_a_checkpoint_that_is_a_broken_link_is_refused(tmp_path: Path) -> None:
    """epoch_2.safetensors -> a deleted file was left out of the run without a word."""
    for step in (1, 3):
        touch_weights(tmp_path / f"epoch_{step}.safetensors")
    (tmp_path / "epoch_2.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(InvalidOptionError) as info:
        discover_run(tmp_path)
    assert str(info.value) == (f"{tmp_path / 'epoch_2.safetensors'} is a broken link: a checkpoint of the run cannot "
                               "be read; restore its target or remove the link")


def test_one_checkpoint_at_two_steps_is_refused(tmp_path: Path) -> None:
    """A link named for another step, or a copied run-CSV row, made one model two steps of the run."""
    for step in (1, 2):
        touch_weights(tmp_path / f"epoch_{step}.safetensors")
    (tmp_path / "epoch_3.safetensors").symlink_to(tmp_path / "epoch_2.safetensors")
    with pytest.raises(InvalidOptionError) as info:
        discover_run(tmp_path)
    assert str(info.value) == (f"{tmp_path}: steps 2 and 3 are the same checkpoint ({tmp_path / 'epoch_2.safetensors'})"
                               "; each step needs its own")
    (tmp_path / "run.csv").write_text("step,checkpoint\n10,epoch_1.safetensors\n20,./epoch_1.safetensors\n")
    with pytest.raises(InvalidOptionError, match=r"run.csv: steps 10 and 20 are the same checkpoint \("):
        discover_run(tmp_path / "run.csv")


def test_the_step_pattern_reads_a_run_csvs_neighbours_and_a_revision_list(tmp_path: Path) -> None:
    """--step-pattern was used for a folder only: a run CSV's files were read by the default rule (and refused
    with "pass --step-pattern"), a revision list's steps taken from the last number (v3, v4: steps 3, 4)."""
    for step in (10, 20):
        touch_weights(tmp_path / f"model-{step}-acc{step // 10 + 90}.safetensors")
    (tmp_path / "run.csv").write_text("step,test_loss\n10,0.5\n20,0.4\n")
    run = discover_run(tmp_path / "run.csv", step_pattern=r"model-(\d+)-")
    assert [(c.step, Path(str(c.ref)).name, c.test_loss) for c in run.checkpoints] == [
        (10, "model-10-acc91.safetensors", 0.5), (20, "model-20-acc92.safetensors", 0.4)]
    run = discover_run("org/m@ck-7-v3,org/m@ck-8-v4", step_pattern=r"ck-(\d+)")
    assert [c.step for c in run.checkpoints] == [7, 8]
    with pytest.raises(InvalidOptionError) as info:
        discover_run("org/m@ck-7-v3,org/m@ck-8-v4", step_pattern=r"step(\d+)")
    assert str(info.value) == "cannot parse a step from the revision of 'org/m@ck-7-v3' with --step-pattern 'step(\\\\d+)'"


def test_a_trainer_folder_keeps_its_eval_metrics_under_a_step_pattern(tmp_path: Path) -> None:
    """With --step-pattern, a Trainer output folder's trainer_state.json was not read: no test metrics."""
    for step in (10, 20):
        touch_weights(tmp_path / f"checkpoint-{step}" / "model.safetensors")
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": 10, "eval_loss": 0.5}, {"step": 20, "eval_loss": 0.25}]}))
    for pattern in (None, r"checkpoint-(\d+)"):
        run = discover_run(tmp_path, step_pattern=pattern)
        assert [(c.step, c.test_loss) for c in run.checkpoints] == [(10, 0.5), (20, 0.25)]


def test_the_step_pattern_reads_the_calibration_runs(tmp_path: Path) -> None:
    """read_runs_csv read each run with the default step rule whatever --step-pattern said."""
    from wbfe.watch import read_runs_csv

    for run in ("a", "b"):
        for step in (10, 20):
            touch_weights(tmp_path / run / f"model-{step}-acc{step // 10 + 90}.safetensors")
    (tmp_path / "a" / "metrics.csv").write_text("step,test_loss\n10,0.5\n20,0.4\n")
    (tmp_path / "runs.csv").write_text("run\na\nb\n")
    (tmp_path / "b" / "rows.csv").write_text("run,step,test_loss\nb,10,0.7\nb,20,0.6\n")
    for table in (tmp_path / "runs.csv", tmp_path / "b" / "rows.csv"):
        runs = read_runs_csv(table, step_pattern=r"model-(\d+)-")
        assert [[(c.step, Path(str(c.ref)).name) for c in run.checkpoints] for run in runs][-1] == [
            (10, "model-10-acc91.safetensors"), (20, "model-20-acc92.safetensors")]
        with pytest.raises(InvalidOptionError, match="ambiguous checkpoint names"):
            read_runs_csv(table)


# --- the rule -----------------------------------------------------------------------------------

def test_layer_statistic_is_the_median_log_ratio() -> None:
    h = np.array([[4.0, 1.0, 2.0], [1.0, np.nan, 0.5], [np.nan, np.nan, np.nan]])
    h_star = np.full_like(h, 2.0)
    stat = layer_statistic(h, h_star)
    assert stat[0] == pytest.approx(0.0)  # median of log(2), log(0.5), log(1)
    assert stat[1] == pytest.approx(0.5 * (math.log(0.5) + math.log(0.25)))
    assert math.isnan(stat[2])


def test_layer_statistic_is_the_median_not_the_mean() -> None:
    # log ratios log 4, log 1/2, log 1: median 0, mean log(2)/3
    stat = layer_statistic(np.array([[8.0, 1.0, 2.0]]), np.full((1, 3), 2.0))
    assert stat[0] == 0.0


def test_recommend_first_crossing_and_its_edge_cases() -> None:
    steps = [0, 10, 20, 30]
    h = np.array([[8.0], [4.0], [2.0], [1.0]])
    crit = critical_lambda(h, np.ones_like(h))  # h*(1) = 1 => h ≤ h*(λ) iff λ ≤ 1/h
    np.testing.assert_allclose(crit, [0.125, 0.25, 0.5, 1.0])
    rec = recommend(steps, crit, 0.3)  # h* = 3.33: first h below is 2 (step 20)
    assert (rec.index, rec.step, rec.crossed) == (2, 20, True)
    assert rec.reason == "first checkpoint with h ≤ h*(λ=0.3): h/h* = 0.600 (step 10: 1.200)"
    assert recommend(steps, crit, 0.5).step == 20  # h = h* exactly counts as crossed
    never = recommend(steps, crit, 2.0)
    assert (never.step, never.crossed) == (30, False)
    assert never.reason.startswith("h > h*(λ=2) at every checkpoint (under-fit throughout")
    first = recommend(steps, crit, 0.1)
    assert (first.step, first.crossed) == (0, True) and "already at the first checkpoint" in first.reason
    assert recommend(steps, np.full(4, np.nan), 1.0).step is None
    with pytest.raises(InvalidOptionError):
        recommend(steps, crit, -1.0)


def test_calibration_leave_one_out_on_known_runs() -> None:
    # Three runs whose test loss is lowest exactly where h first drops below H0 = 3 (h*(1) = 1, so
    # the right λ is any value in (1/4, 1/3]; λ = 1/3.5 from the grid below lies inside).
    hs = [np.array([8.0, 5.0, 2.9, 2.0, 1.0]), np.array([6.0, 2.5, 1.5, 1.0, 0.5]),
          np.array([9.0, 7.0, 4.0, 2.0, 1.0])]
    losses = []
    for h in hs:
        best = int(np.argmax(h <= 3.0))
        losses.append(0.3 + 0.05 * np.abs(np.arange(h.size) - best))
    crits = [critical_lambda(h[:, None], np.ones((h.size, 1))) for h in hs]
    steps = [list(range(0, 50, 10))] * 3
    grid = np.array([0.1, 1 / 5, 1 / 3.5, 0.4, 0.7, 1.5])
    cal = calibrate_lambda(["a", "b", "c"], steps, crits, losses, grid=grid)
    assert cal.lam_all == pytest.approx(1 / 3.5)
    assert [r.gap for r in cal.held_out] == [0.0, 0.0, 0.0]
    assert [r.recommended_step for r in cal.held_out] == [20, 10, 30]
    assert cal.mean_gap[0] == pytest.approx(np.mean([0.1, 0.05, 0.15]))  # λ=0.1: every run stops at step 0
    with pytest.raises(InvalidOptionError, match="at least 2 runs"):
        calibrate_lambda(["a"], steps[:1], crits[:1], losses[:1])


def test_a_calibration_report_hands_back_its_scored_runs() -> None:
    """The report's trajectories are the runs as scored: each watched at the λ chosen on all runs, without scoring
    again, stops where the calibration said (the known runs above, built as fits: h = κ/β, h*(1) = 2γ = 1)."""
    from wbfe.watch import calibrate, result_at
    from wbfe.watch.trajectories import CheckpointPoint, LayerPoint, Trajectory

    hs = {"a": [8.0, 5.0, 2.9, 2.0, 1.0], "b": [6.0, 2.5, 1.5, 1.0, 0.5], "c": [9.0, 7.0, 4.0, 2.0, 1.0]}
    trajs = []
    for name, h in hs.items():
        best = int(np.argmax(np.array(h) <= 3.0))
        trajs.append(Trajectory(name, [CheckpointPoint(10 * t, f"{name}/{t}", (LayerPoint(
            "fc", "head", 0.5, kappa, 1.0, 0.0, 0.01, math.nan, math.nan, math.nan),), 0.3 + 0.05 * abs(t - best))
            for t, kappa in enumerate(h)]))
    report = calibrate(trajs, grid=np.array([0.1, 1 / 5, 1 / 3.5, 0.4, 0.7, 1.5]))
    assert report.calibration.lam_all == pytest.approx(1 / 3.5)
    assert [t.run for t in report.trajectories] == ["a", "b", "c"]
    watched = [result_at(t, report.calibration.lam_all).recommendation for t in report.trajectories]
    assert [r.step for r in watched if r is not None] == [20, 10, 30]
    again = calibrate(report.trajectories, grid=np.array([0.2, 0.3]))
    assert again.calibration.lam_all == pytest.approx(0.3)


def test_bfe_at_matches_bfe_at_a_fixed_lambda() -> None:
    from wbfe.metrics.bfe import bfe
    from wbfe.watch import bfe_at

    eigs = np.random.default_rng(3).gamma(2.0, 0.7, size=50)
    f_star, lam_star = bfe(eigs, "opt")
    for lam in (0.01, lam_star, 3.0):
        assert bfe_at(f_star, lam_star, lam) == pytest.approx(bfe(eigs, lam)[0], rel=1e-12, abs=1e-12)


# --- synthetic HTMP runs through the whole pipeline -----------------------------------------------

def test_synthetic_run_recommends_the_true_crossing(tmp_path: Path) -> None:
    from wbfe.watch import watch

    true_h = write_synthetic_run(tmp_path / "run")
    lam = _crossing_lambda()
    h_star_true = 2 * GAMMA / lam
    assert true_h[K_CROSS - 1] > h_star_true >= true_h[K_CROSS]
    result = watch(tmp_path / "run", lam=lam)
    assert result.recommendation is not None
    assert result.recommendation.step == K_CROSS * 100
    assert result.recommendation.crossed
    data = json.loads(result.to_json())
    assert [c["step"] for c in data["checkpoints"]] == [t * 100 for t in range(8)]
    # The rule on the reported columns: the first checkpoint with h ≤ h*.
    fitted = [(c["layers"][0]["h"], c["layers"][0]["h_star"]) for c in data["checkpoints"]]
    assert next(i for i, (h, hs) in enumerate(fitted) if h <= hs) == K_CROSS
    # The fitted h tracks the true schedule (few-per-cent fits on 80 eigenvalues: within 25 %).
    np.testing.assert_allclose([h for h, _ in fitted], true_h, rtol=0.25)
    assert data["recommended"]["step"] == K_CROSS * 100 and data["lambda"] == pytest.approx(lam)


@pytest.mark.slow
def test_calibration_on_synthetic_runs_has_zero_held_out_gap(tmp_path: Path) -> None:
    from wbfe.watch import calibrate, trajectory
    from wbfe.watch.runs import Run

    trajs = []
    for r, beta0 in enumerate((1.0, 1 / RATE, RATE)):  # crossings at K_CROSS, K_CROSS + 1, K_CROSS - 1
        write_synthetic_run(tmp_path / f"r{r}", steps=6, beta0=beta0, seed=r + 1)
        run = discover_run(tmp_path / f"r{r}")
        cross = K_CROSS + {0: 0, 1: 1, 2: -1}[r]
        loss = [0.4 + 0.1 * abs(t - cross) for t in range(6)]
        run = Run(run.name, tuple(type(c)(c.step, c.ref, loss[t]) for t, c in enumerate(run.checkpoints)))
        trajs.append(trajectory(run))
    report = calibrate(trajs)
    assert [r.gap for r in report.calibration.held_out] == [0.0, 0.0, 0.0]
    assert [r.recommended_step for r in report.calibration.held_out] == [400, 500, 300]
    h_cross = 2 * GAMMA / report.calibration.lam_all
    assert KAPPA / RATE**K_CROSS <= h_cross < KAPPA / RATE ** (K_CROSS - 1)


# --- the in-training monitor ----------------------------------------------------------------------

def _tiny_model():  # noqa: ANN202
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(80, 20), torch.nn.ReLU(), torch.nn.Linear(20, 12))
    # Heavy-tailed column scales: small κ keeps the HTMP fits fast (near-MP spectra take ~30 s).
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in (model[0], model[2]):
            layer.weight.mul_(torch.exp(1.5 * torch.randn(layer.weight.shape[1], generator=g)))
    return model


def test_monitor_numbers_equal_wbfe_score_on_the_same_weights(tmp_path: Path) -> None:
    htmp_module()
    import torch
    from safetensors.torch import save_file

    import wbfe
    from wbfe.watch import Monitor

    torch.set_num_threads(1)
    model = _tiny_model()
    monitor = Monitor(model, every=2, layers="all")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 80, generator=torch.Generator().manual_seed(1)), torch.arange(64) % 12
    path = tmp_path / "step_2.safetensors"
    for step in range(3):
        if monitor(step) is not None and step == 2:  # after two updates: save what the monitor saw
            save_file({k: v.detach().clone() for k, v in model.state_dict().items()}, str(path))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert monitor.trajectory.steps == [0, 2]
    lam = 0.7
    reference = {r["name"]: r for r in wbfe.score(str(path), lam=lam, metrics=("bfe", "htsr", "htmp")).layers}
    rows = monitor.result(lam).to_dict()["checkpoints"][-1]["layers"]
    assert {r["name"] for r in rows} == set(reference) == {"0.weight", "2.weight"}
    for row in rows:
        ref = reference[row["name"]]
        for column in ("htmp_kappa", "htmp_beta", "htmp_tau", "h", "h_star", "f_inf", "bfe", "alpha"):
            assert row[column] == pytest.approx(ref[column], rel=1e-9), (row["name"], column)
        assert row["diagnosis"] == ref["diagnosis"]
    with pytest.raises(InvalidOptionError, match="step 1 is not after the last recorded step 2"):
        monitor.record(1)
    with pytest.raises(InvalidOptionError):
        Monitor(model, every=0)


def test_lightning_callback_needs_lightning(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from wbfe.watch import Monitor, lightning_callback

    # A None entry in sys.modules makes the import fail, as if neither package were installed.
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingDependencyError, match="needs lightning"):
        lightning_callback(Monitor({}, every=1))


def test_plot_writes_a_png(tmp_path: Path) -> None:
    from wbfe.reporting.plots.watch import plot_watch
    from wbfe.watch import CheckpointPoint, LayerPoint, Trajectory, result_at

    htmp_module()
    traj = Trajectory("run")
    for t, beta in enumerate((1.0, 2.0, 4.0)):
        layer = LayerPoint("classifier.weight", "head", 0.25, 2.0, beta, 0.0, 0.01, 1.5, 1.0, 3.0)
        traj.points.append(CheckpointPoint(t, f"s{t}", (layer,), test_loss=[0.5, 0.3, 0.4][t]))
    result = result_at(traj, 0.5)  # h* = 2γ/λ = 1: h = 2, 1, 0.5 -> step 1
    assert result.recommendation.step == 1
    out = plot_watch(result, tmp_path / "w.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    comparison = result.comparison()
    assert comparison is not None
    assert {k: comparison[k] for k in ("best_step", "recommended_step", "test_loss_gap", "steps_from_best")} == {
        "best_step": 1, "recommended_step": 1, "test_loss_gap": 0.0, "steps_from_best": 0}
    assert result_at(traj, 2.0).comparison()["test_loss_gap"] == pytest.approx(0.1)  # h* = 0.25: never, keep step 2


def test_critical_lambda_is_one_over_the_htmp_mean() -> None:
    # h/h*(1) = κ/(2γβ) + τ for any gap (docs/math.md §3 formulas), so λ_c = 1 / E_HTMP[e].
    htmp = htmp_module()
    from wbfe.watch import CheckpointPoint, LayerPoint, Trajectory

    traj = Trajectory("run")
    params = [(0.3, 0.5, 2.0, 0.0), (0.1, 3.0, 0.7, 0.2), (0.6, 40.0, 5.0, 1.5)]
    for t, (gamma, kappa, beta, tau) in enumerate(params):
        layer = LayerPoint("w", "head", gamma, kappa, beta, tau, 0.0, 1.0, 1.0, 2.0)
        traj.points.append(CheckpointPoint(t, "s", (layer,)))
    expected = [1.0 / htmp.mean(kappa, gamma, beta, tau) for gamma, kappa, beta, tau in params]
    np.testing.assert_allclose(traj.critical_lambdas(), expected, rtol=1e-12)


def test_lightning_callback_records_every_epoch() -> None:
    """A real Lightning Trainer: the callback records one checkpoint per epoch, equal to a direct record."""
    pl = pytest.importorskip("pytorch_lightning", reason="pytorch-lightning (a test dependency) not installed")
    htmp_module()
    import torch

    from wbfe.watch import Monitor, lightning_callback

    torch.set_num_threads(1)

    class Tiny(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = _tiny_model()

        def training_step(self, batch: tuple, _: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 80, generator=g), torch.arange(64) % 12)
    module = Tiny()
    monitor = Monitor(module.net, every=1, layers="all")
    trainer = pl.Trainer(max_epochs=2, callbacks=[lightning_callback(monitor)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=32))
    assert monitor.trajectory.steps == [0, 1]
    direct = Monitor(module.net, every=1, layers="all")
    direct.record(1)
    got = monitor.result(0.7).to_dict()["checkpoints"][-1]["layers"]
    want = direct.result(0.7).to_dict()["checkpoints"][-1]["layers"]
    assert [r["name"] for r in got] == [r["name"] for r in want]
    for a, b in zip(got, want):
        assert a["bfe"] == b["bfe"] and a["h"] == b["h"]


# --- malformed run tables: one line each (they raised UnicodeDecodeError, AttributeError, or were read wrong) ----

@pytest.mark.parametrize("raw, message", [
    ("step,test_loss,note\n1,0.5,caf\xe9\n".encode("latin-1"),
     r"metrics.csv is not UTF-8 text \(byte 0xe9 at offset 29\); save it as UTF-8"),
    (b"step,test_loss\n1,0.5,0.9\n", "metrics.csv: line 2 has more cells than the header"),
    (b"step,test_loss,test_loss\n1,0.5,0.9\n", "metrics.csv: column 'test_loss' appears twice in the header"),
])
def test_a_malformed_metrics_csv_is_refused(tmp_path: Path, raw: bytes, message: str) -> None:
    touch_weights(tmp_path / "epoch_1.safetensors")
    (tmp_path / "metrics.csv").write_bytes(raw)
    with pytest.raises(InvalidOptionError, match=message):
        discover_run(tmp_path)


def test_a_second_metrics_row_for_one_step_is_refused(tmp_path: Path) -> None:
    """The last row for a step used to win silently (a resumed run logging its step twice)."""
    for step in (1, 2):
        touch_weights(tmp_path / f"epoch_{step}.safetensors")
    (tmp_path / "metrics.csv").write_text("step,test_loss\n1,0.5\n1,0.7\n2,0.4\n")
    with pytest.raises(InvalidOptionError, match=r"metrics.csv:3: a second row for step 1; keep one row per step"):
        discover_run(tmp_path)


@pytest.mark.parametrize("step", [None, "x", 10.7, float("inf")])
def test_a_trainer_state_step_that_is_no_integer_is_refused(tmp_path: Path, step: object) -> None:
    """int(step) raised TypeError, ValueError or OverflowError, or cut 10.7 to 10."""
    touch_weights(tmp_path / "checkpoint-10" / "model.safetensors")
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": step, "eval_loss": 1.0}]}))
    with pytest.raises(InvalidOptionError, match=r"trainer_state.json: log_history: step .* is not an integer"):
        discover_run(tmp_path)
    (tmp_path / "trainer_state.json").write_text("[" * 100_000)  # RecursionError from json
    with pytest.raises(InvalidOptionError, match="not a readable trainer_state.json"):
        discover_run(tmp_path)


def test_a_csv_step_is_read_exactly(tmp_path: Path) -> None:
    """A step past 2**53 went through a float: 12345678901234567890 became 12345678901234567168."""
    touch_weights(tmp_path / "w.safetensors")
    (tmp_path / "run.csv").write_text("step,checkpoint\n12345678901234567890,w.safetensors\n")
    assert discover_run(tmp_path / "run.csv").checkpoints[0].step == 12345678901234567890


def test_a_run_listed_twice_under_two_names_is_refused_before_scoring(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A link to a run, or ../runs/a beside a, passed the check by name: held out, its copy stayed in (gap 0)."""
    import wbfe.watch.calibration
    from wbfe.watch import calibrate

    for step in (1, 2):
        touch_weights(tmp_path / "a" / f"epoch_{step}.safetensors")
    (tmp_path / "a" / "metrics.csv").write_text("step,test_loss\n1,0.5\n2,0.4\n")
    (tmp_path / "alink").symlink_to(tmp_path / "a")
    monkeypatch.setattr(wbfe.watch.calibration, "trajectory", lambda *a, **k: pytest.fail("scored"))
    for second, name in (("alink", "alink"), (f"../{tmp_path.name}/a", f"../{tmp_path.name}/a")):
        (tmp_path / "runs.csv").write_text(f"run\na\n{second}\n")
        with pytest.raises(InvalidOptionError) as info:
            calibrate(tmp_path / "runs.csv")
        assert str(info.value) == (f"run {tmp_path / name} is listed twice (as {tmp_path / 'a'}: the same "
                                   "checkpoints): leave-one-run-out needs each run once")
    rows = "".join(f"{run},{step},0.5,a/epoch_{step}.safetensors\n" for run in ("x", "y") for step in (1, 2))
    (tmp_path / "rows.csv").write_text("run,step,test_loss,checkpoint\n" + rows)
    with pytest.raises(InvalidOptionError, match=r"^run y is listed twice \(as x: the same checkpoints\)"):
        calibrate(tmp_path / "rows.csv")


def test_a_calibration_run_without_test_losses_is_refused_before_scoring(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run was scored before calibrate_lambda found that one has no test loss."""
    import wbfe.watch.calibration
    from wbfe.watch import calibrate

    for run in ("a", "b"):
        for step in (1, 2):
            touch_weights(tmp_path / run / f"epoch_{step}.safetensors")
    (tmp_path / "a" / "metrics.csv").write_text("step,test_loss\n1,0.5\n2,0.4\n")
    monkeypatch.setattr(wbfe.watch.calibration, "trajectory", lambda *a, **k: pytest.fail("scored"))
    with pytest.raises(InvalidOptionError) as info:
        calibrate([tmp_path / "a", tmp_path / "b"])
    assert str(info.value) == f"run {tmp_path / 'b'}: every checkpoint needs a finite test_loss"


def test_a_run_listed_twice_is_refused_by_the_calibration() -> None:
    """Held out, its copy stayed in: a test-loss gap of 0 by construction, reported as a calibration."""
    crit, loss = np.array([0.5, 1.0, 2.0]), np.array([0.9, 0.5, 0.7])
    with pytest.raises(InvalidOptionError, match="run a is listed twice: leave-one-run-out needs each run once"):
        calibrate_lambda(["a", "b", "a"], [[1, 2, 3]] * 3, [crit] * 3, [loss] * 3)


def test_checkpoints_of_two_architectures_are_refused(tmp_path: Path) -> None:
    """h_t compared classifier.weight at one step with fc.weight at the next, and recommended a step."""
    import torch
    from safetensors.torch import save_file

    from wbfe.watch import trajectory

    save_file({"classifier.weight": torch.eye(12)}, str(tmp_path / "step_1.safetensors"))
    save_file({"fc.weight": torch.eye(12)}, str(tmp_path / "step_2.safetensors"))
    with pytest.raises(InvalidOptionError, match="step 2 selects layers fc.weight but step 1 selected "
                                                 "classifier.weight: a run's checkpoints are one model's"):
        trajectory(tmp_path, layers="all", device="cpu")


def test_a_recommended_checkpoint_without_a_test_loss_says_so() -> None:
    """The table printed "recommended: nan (gap +nan)"."""
    from wbfe.watch.rule import Recommendation
    from wbfe.watch.trajectories import CheckpointPoint, LayerPoint, Trajectory, WatchResult

    layer = LayerPoint("w", "head", 0.25, 2.0, 1.0, 1.0, 0.1, 1.0, 1.0, 3.0)
    points = [CheckpointPoint(step, f"s{step}", (layer,), test_loss=loss) for step, loss in ((1, 0.5), (2, math.nan))]
    table = WatchResult(Trajectory("run", points), 1.0, "given", Recommendation(1, 2, True, "why")).table()
    assert "best test loss at step 1 (0.5000); recommended: no test loss at step 2\n" in table


@pytest.mark.parametrize("kwargs, message", [
    ({"layers": "(a+)+$"}, "can take exponential time"),
    ({"device": "tpu"}, "device must be"),
    ({"every": True}, "every must be a positive integer, not True"),
])
def test_monitor_refuses_bad_settings_when_built(kwargs: dict, message: str) -> None:
    """A bad --layers or device was found at the first record, after an epoch of training; every=True meant 1."""
    from wbfe.watch import Monitor

    with pytest.raises(InvalidOptionError, match=message):
        Monitor({}, **kwargs)


def test_an_empty_run_cell_of_a_calibration_csv_is_refused(tmp_path: Path) -> None:
    """An empty cell named the CSV's own folder (path.parent / ""), read as one more run."""
    from wbfe.watch import read_runs_csv

    (tmp_path / "runs.csv").write_text("run\nr0\n\"\"\n")
    with pytest.raises(InvalidOptionError, match=r"runs.csv: line 3 has an empty 'run' cell"):
        read_runs_csv(tmp_path / "runs.csv")


def test_a_step_of_thousands_of_digits_is_refused_in_one_line(tmp_path):
    # int() of more than 4,300 digits raises ValueError (Python's limit): it escaped untyped.
    (tmp_path / "run.csv").write_text(f"step,checkpoint\n{'1' * 5000},a.safetensors\n")
    with pytest.raises(InvalidOptionError, match=r"step '1{20}.*' is not an integer$"):
        discover_run(tmp_path / "run.csv")


def test_watch_calls_progress_as_score_does_and_feeds_the_command_lines_bar(tmp_path: Path) -> None:
    """progress was called with (done, total, step) where every other wbfe progress gets (done, total, name), and
    never with the (0, total, "") start: the command line's bar raised TypeError on the step."""
    import io

    from rich.console import Console

    from cli._progress import progress_bar
    from wbfe.watch import watch

    for step in (10, 20, 30):
        touch_weights(tmp_path / f"step_{step}.safetensors")
    calls: list[tuple[int, int | None, str]] = []
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    with progress_bar(enabled=True, what="watching", unit="checkpoints", console=console) as update:
        assert update is not None

        def both(done: int, total: int | None, name: str) -> None:
            calls.append((done, total, name))
            update(done, total, name)

        watch(tmp_path, layers="all", device="cpu", progress=both)
    assert calls == [(0, 3, ""), (1, 3, "step 10"), (2, 3, "step 20"), (3, 3, "step 30")]
    assert "3/3" in out.getvalue() and "step 30" in out.getvalue()


@pytest.mark.parametrize("name", ["watch", "trajectory", "calibrate", "scan_checkpoint"])
def test_keyword_defaults_are_the_watch_options_defaults(name: str) -> None:
    """The keywords' defaults were written a second time in each signature; they are WatchOptions' own."""
    import inspect
    from dataclasses import fields

    import wbfe.watch
    from wbfe.options import WatchOptions

    own = {f.name: f.default for f in fields(WatchOptions)}
    params = inspect.signature(getattr(wbfe.watch, name)).parameters
    shared = {key: p.default for key, p in params.items() if key in own}
    assert set(shared) >= {"layers", "head", "device"}
    assert shared == {key: own[key] for key in shared}
    assert ("lam" in shared) == (name == "watch")
