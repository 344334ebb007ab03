"""Run ``wbfe watch`` on the runs of ``train_runs.py``: leave-one-seed-out λ, recommended vs best epoch.

For every run the checkpoints are scored once with all layers (``wbfe.watch.trajectory``, one torch
thread; cached in ``trajectories.json`` so re-analysis is instant). Then, for each layer selection
(the head ``classifier.weight``, ``fc1.weight``, ``features.3.weight``, and the median over all of
them) and each group of runs (Adam with clean labels, Adam with 30 % label noise, all six Adam runs,
SGD with weight decay and 30 % label noise), λ is chosen by
leave-one-seed-out (``wbfe.watch.calibrate``) and each held-out run reports: the epoch of minimum
test loss, the recommended epoch, and the test-loss gap. Run from the repository root:

    .venv/bin/python benchmarks/dynamics/analyse.py [--runs DIR]

Writes ``benchmarks/results/dynamics/{trajectories,dynamics}.json`` and PNGs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wbfe.watch import LayerPoint

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.dynamics.train_runs import DEFAULT_RUNS  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "dynamics"
SELECTIONS = {"head": "classifier.weight", "fc1": "fc1.weight", "conv2": "features.3.weight", "all": None}


def _to_json(traj) -> dict:  # noqa: ANN001
    return {"run": traj.run, "points": [{"step": p.step, "source": p.source, "test_loss": p.test_loss,
                                         "test_accuracy": p.test_accuracy,
                                         "layers": [{k: v for k, v in asdict(layer).items()} for layer in p.layers]}
                                        for p in traj.points]}


def _layer_from_json(layer: dict[str, Any]) -> LayerPoint:
    """One matrix's numbers as ``_to_json`` wrote them, a null number (a failed fit) back to NaN."""
    from wbfe.watch import LayerPoint

    fields: dict[str, Any] = {k: (math.nan if v is None and k not in ("name", "role", "reasons") else v)
                              for k, v in layer.items()}
    return LayerPoint(**fields)


def _from_json(data: dict):  # noqa: ANN202
    from wbfe.watch import CheckpointPoint, Trajectory

    nan = lambda v: math.nan if v is None else v  # noqa: E731
    traj = Trajectory(run=data["run"])
    for p in data["points"]:
        layers = tuple(_layer_from_json(layer) for layer in p["layers"])
        traj.points.append(CheckpointPoint(p["step"], p["source"], layers, nan(p["test_loss"]), nan(p["test_accuracy"])))
    return traj


def _select(traj, name):  # noqa: ANN001, ANN202
    from wbfe.watch import CheckpointPoint, Trajectory

    out = Trajectory(run=traj.run)  # always a new object: callers may drop points
    for p in traj.points:
        out.points.append(CheckpointPoint(p.step, p.source, tuple(x for x in p.layers if name in (None, x.name)),
                                          p.test_loss, p.test_accuracy))
    return out


def score_runs(runs_root: Path, cache: Path) -> list:
    """Score (or load from the cache) every run under ``runs_root``, layers ``all``."""
    import torch

    from wbfe.watch import trajectory

    torch.set_num_threads(1)
    cached = {d["run"]: d for d in json.loads(cache.read_text())} if cache.is_file() else {}
    trajs = []
    for run_dir in sorted(p for p in runs_root.iterdir() if (p / "metrics.csv").is_file()):
        key = run_dir.name
        if key in cached:
            trajs.append(_from_json(cached[key]))
            continue
        started = time.perf_counter()
        traj = trajectory(run_dir / "metrics.csv", layers="all", device="cpu")
        traj.run = key
        print(f"{key}: {len(traj.points)} checkpoints in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        trajs.append(traj)
        cached[key] = _to_json(traj)
        cache.write_text(json.dumps(list(cached.values()), indent=None, allow_nan=True) + "\n")
    return trajs


def _spearman(x, y) -> float:  # noqa: ANN001
    import numpy as np
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    return float(stats.spearmanr(x[ok], y[ok])[0]) if ok.sum() > 2 else math.nan


def _calibrated(groups: dict, layer, keep_init: bool) -> dict:  # noqa: ANN001
    """Leave-one-seed-out calibration of every group for one layer selection."""
    from wbfe.watch import calibrate

    out = {}
    for group, members in groups.items():
        if len(members) < 2:
            continue
        chosen = [_select(t, layer) for t in members]
        if not keep_init:
            for t in chosen:
                t.points = [p for p in t.points if p.step > 0]
        d = calibrate(chosen, layers=layer or "all").to_dict()
        out[group] = {
            "held_out_gap_mean": d["held_out_gap_mean"], "lambda_all_runs": d["lambda_all_runs"],
            "runs": [{"run": r["run"], "lambda": r["lambda"], "best_epoch": r["best_step"],
                      "recommended_epoch": r["recommended_step"], "test_loss_gap": r["test_loss_gap"],
                      "best_test_loss": r["best_test_loss"]} for r in d["runs"]],
        }
    return out


def analyse(trajs: list) -> dict:
    """Leave-one-seed-out λ for every (selection, group); per held-out run: best/recommended epoch and gap."""
    import numpy as np

    groups = {"clean": [t for t in trajs if t.run.startswith("noise0-")],
              "noise0.3": [t for t in trajs if t.run.startswith("noise0.3-")],
              "adam-all": [t for t in trajs if t.run.startswith("noise")],
              "sgdwd-noise0.3": [t for t in trajs if t.run.startswith("sgdwd-")]}
    out: dict = {"selections": {}, "selections_from_epoch1": {}, "trends": {}}
    for key, keep_init in (("selections", True), ("selections_from_epoch1", False)):
        for sel, layer in SELECTIONS.items():
            out[key][sel] = _calibrated(groups, layer, keep_init)
    for t in trajs:
        steps = t.steps
        trend = {}
        for name in ("classifier.weight", "fc1.weight", "features.3.weight"):
            sub = _select(t, name)
            h = sub.matrix(lambda x: x.h)[:, 0]
            kappa = sub.matrix(lambda x: x.kappa)[:, 0]
            beta = sub.matrix(lambda x: x.beta)[:, 0]
            trend[name] = {"rho_h_epoch": _spearman(steps[1:], h[1:]), "rho_kappa_epoch": _spearman(steps[1:], kappa[1:]),
                           "rho_beta_epoch": _spearman(steps[1:], beta[1:]),
                           "h_first_last": [float(h[1]), float(h[-1])],
                           "kappa_first_last": [float(kappa[1]), float(kappa[-1])],
                           "n_failed_fits": int(np.sum(~np.isfinite(h)))}
        loss = t.test_losses()
        out["trends"][t.run] = {"best_epoch": int(steps[int(np.nanargmin(loss))]), "best_test_loss": float(np.nanmin(loss)),
                                "last_test_loss": float(loss[-1]), "layers": trend}
    return out


def _group_of(run: str) -> str:
    return "sgdwd-noise0.3" if run.startswith("sgdwd-") else "noise0.3" if run.startswith("noise0.3-") else "clean"


def plots(trajs: list, analysis: dict) -> list[str]:
    """One watch figure per run (head and fc1 at the λ chosen on all runs of its group) and calibration curves."""
    from wbfe.reporting.plots.watch import plot_calibration, plot_watch
    from wbfe.watch import calibrate, result_at

    written = []
    for t in trajs:
        group = _group_of(t.run)
        for sel in ("fc1", "head"):
            layer = SELECTIONS[sel]
            assert layer is not None  # "fc1" and "head" each name one matrix
            lam = analysis["selections"][sel][group]["lambda_all_runs"]
            result = result_at(_select(t, layer), lam, lam_source="calibrated", layers=layer)
            written.append(str(plot_watch(result, RESULTS / f"watch-{t.run}-{sel}.png", dpi=70).relative_to(REPO)))
    for sel in ("fc1", "head"):
        layer = SELECTIONS[sel]
        assert layer is not None
        for group in ("noise0.3", "sgdwd-noise0.3"):
            members = [_select(t, layer) for t in trajs if _group_of(t.run) == group]
            if len(members) >= 2:
                report = calibrate(members, layers=layer)
                written.append(str(plot_calibration(report, RESULTS / f"calibration-{group}-{sel}.png",
                                                    dpi=80).relative_to(REPO)))
    return written


def main(argv: list[str] | None = None) -> int:
    """Score, analyse, plot; write the JSON results; return an exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    trajs = score_runs(args.runs, RESULTS / "trajectories.json")
    analysis = analyse(trajs)
    analysis["plots"] = plots(trajs, analysis)
    analysis["seconds"] = round(time.perf_counter() - started, 1)
    analysis["script"] = "benchmarks/dynamics/analyse.py"
    from wbfe.render.text import json_ready

    (RESULTS / "dynamics.json").write_text(json.dumps(json_ready(analysis), indent=1, allow_nan=False) + "\n")
    for sel, groups in analysis["selections"].items():
        for group, res in groups.items():
            rows = ", ".join(f"{r['run']}: best {r['best_epoch']} rec {r['recommended_epoch']} gap {r['test_loss_gap']:+.3f}"
                             for r in res["runs"])
            print(f"{sel:5s} {group:8s} mean gap {res['held_out_gap_mean']:.3f} | {rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
