"""Benchmark of docs/math.md §7: sequential feature recovery, measured against the predictions.

Runs a few sweeps of :func:`wbfe.theory.hierarchical.simulate_hierarchical` at modest size (the CPU
budget here is two shared cores) and writes, per sweep, ``<name>/hierarchical.json`` (settings,
points, predictions, wall time) and the two figures, plus ``summary.json`` comparing measured
thresholds, NMSE slopes and the kernel gap with the predictions.

    .venv/bin/python benchmarks/theory_hierarchical/run.py            # every sweep
    .venv/bin/python benchmarks/theory_hierarchical/run.py gauss_d30  # one of them
    .venv/bin/python benchmarks/theory_hierarchical/run.py --summary  # summary.json from saved runs
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

# Two shared cores: a multi-threaded BLAS spin-waiting on a loaded machine is many times slower.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from wbfe.reporting.plots.hierarchical import write_figures  # noqa: E402
from wbfe.theory.hierarchical import simulate_hierarchical  # noqa: E402

HERE = Path(__file__).resolve().parent

SWEEPS: dict[str, dict] = {
    # Gaussian-equivalent features: the setting in which the spiked-matrix predictions are exact.
    "gauss_d30": dict(d=30, p=30, gamma=1.0, alpha_min=2.0, alpha_max=3.8, points=13, seeds=3,
                      features="gaussian", kernel_max_n=2000, n_test=2000),
    # Degree-2 Hermite features of x at the default p = round(d^(1/2)).
    "hermite_d40": dict(d=40, p=None, gamma=1.0, alpha_min=1.8, alpha_max=3.4, points=9, seeds=3,
                        features="hermite", kernel_max_n=2000, n_test=2000),
    # A non-linear g*.
    "gauss_d20_tanh": dict(d=20, p=10, gamma=1.0, alpha_min=1.8, alpha_max=3.8, points=11, seeds=3,
                           features="gaussian", activation="tanh", kernel_max_n=2000, n_test=2000),
    # A second decay exponent: NMSE ∝ n^(−1/3).
    "gauss_d30_g075": dict(d=30, p=30, gamma=0.75, alpha_min=2.0, alpha_max=3.6, points=11, seeds=3,
                           features="gaussian", kernel_max_n=2000, n_test=2000),
    # Spectral learner against kernel ridge at equal n through the first recoveries (kernel on all n).
    "equal_n_gauss_d16": dict(d=16, p=10, gamma=1.0, alpha_min=2.0, alpha_max=3.0, points=6, seeds=2,
                              features="gaussian", kernel_max_n=4096, n_test=2000),
    "equal_n_hermite_d16": dict(d=16, p=4, gamma=1.0, alpha_min=2.0, alpha_max=3.0, points=6, seeds=2,
                                features="hermite", kernel_max_n=4096, n_test=2000),
    # The CLI example (d = 60, p = 30, Hermite), cut to alpha <= 3 for the CPU budget.
    "hermite_d60_p30": dict(d=60, p=30, gamma=1.0, alpha_min=2.0, alpha_max=3.0, points=6, seeds=1,
                            features="hermite", kernel_max_n=2000, n_test=2000, solver="dense"),
}


def _arr(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def summarise(data: dict) -> dict:
    """Measured vs predicted figures of one sweep."""
    pred = data["prediction"]
    lead, fin = _arr(pred["alpha_thresholds"]), _arr(pred["alpha_thresholds_finite_d"])
    meas = _arr(pred["alpha_thresholds_measured"])
    half_meas, half_pred = _arr(pred["alpha_half_measured"]), _arr(pred["alpha_half_predicted"])
    ok = np.isfinite(meas)
    order = np.argsort(np.argsort(meas[ok])) if ok.sum() > 1 else None
    rank_corr = (float(np.corrcoef(order, np.arange(ok.sum()))[0, 1]) if order is not None else None)
    equal_n = [
        {"alpha": pt["alpha"], "n": pt["n"], "nmse": pt["nmse"], "nmse_kernel": pt["nmse_kernel"]}
        for pt in data["points"] if pt["n"] <= pt["n_kernel"] and pt["nmse_kernel"] is not None
    ]
    return {
        "p": data["settings"]["p"],
        "features_with_measured_threshold": int(ok.sum()),
        "measured_thresholds": [round(x, 3) for x in meas[ok]],
        "leading_thresholds": [round(x, 3) for x in lead[ok]],
        "finite_d_thresholds": [round(x, 3) for x in fin[ok]],
        "max_abs_dev_leading": float(np.max(np.abs(meas[ok] - lead[ok]))) if ok.any() else None,
        "mean_dev_leading": float(np.mean(meas[ok] - lead[ok])) if ok.any() else None,
        "max_abs_dev_finite_d": float(np.max(np.abs(meas[ok] - fin[ok]))) if ok.any() else None,
        "mean_dev_finite_d": float(np.mean(meas[ok] - fin[ok])) if ok.any() else None,
        "max_abs_dev_half_point": float(np.nanmax(np.abs(half_meas - half_pred))) if ok.any() else None,
        "threshold_rank_correlation_with_i": rank_corr,
        "fitted_slope": pred["fitted_slope"],
        "tail_slope": pred["tail_slope"],
        "finite_d_slope": pred["finite_d_slope"],
        "exponent": pred["exponent"],
        "slope_alpha_range": pred["slope_alpha_range"],
        "tail_constant": pred["tail_constant"],
        "kernel_floor": pred.get("kernel_floor"),
        "nmse": [pt["nmse"] for pt in data["points"]],
        "nmse_finite_d": pred["nmse_finite_d"],
        "nmse_kernel": [pt["nmse_kernel"] for pt in data["points"]],
        "equal_n_spectral_vs_kernel": equal_n,
    }


def write_summary() -> dict:
    """Rebuild ``summary.json`` from every saved sweep (runs in separate processes may overlap)."""
    summary = {}
    for name in SWEEPS:
        path = HERE / name / "hierarchical.json"
        if path.exists():
            data = json.loads(path.read_text())
            summary[name] = {"wall_seconds": data["wall_seconds"], **summarise(data)}
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(names: list[str]) -> None:
    for name in names or list(SWEEPS):
        start = time.perf_counter()
        data = simulate_hierarchical(**SWEEPS[name]).to_dict()
        data["wall_seconds"] = round(time.perf_counter() - start, 1)
        out = HERE / name
        out.mkdir(exist_ok=True)
        (out / "hierarchical.json").write_text(json.dumps(data, indent=1))
        write_figures(data, out)
        print(name, json.dumps(write_summary()[name]), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--summary"]:
        write_summary()
    else:
        main(sys.argv[1:])
