"""Figures of the hierarchical sequential-recovery sweep (docs/math.md §7), drawn from a
``HierarchicalResult`` or its ``to_dict()`` (a saved run re-plots without recomputing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

import numpy as np

from wbfe.render.text import number_text
from wbfe.reporting.plots.canvas import new_axes, save

__all__ = ["plot_overlaps", "plot_nmse", "write_figures"]

Result = Union[dict, Any]


def _nan(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def plot_overlaps(result: Result, path: Union[str, Path]) -> Path:
    """Per-feature overlaps q_i against log_d n, with the predicted thresholds marked, as a PNG at ``path``."""
    import matplotlib

    res = result if isinstance(result, dict) else result.to_dict()
    alphas = np.array([pt["alpha"] for pt in res["points"]])
    q = np.array([pt["q"] for pt in res["points"]])
    lead = _nan(res["prediction"]["alpha_thresholds"])
    fin = _nan(res["prediction"]["alpha_thresholds_finite_d"])
    p = q.shape[1]
    colors = matplotlib.colormaps["viridis"](np.linspace(0.0, 0.9, p))
    fig, ax = new_axes((7.0, 4.5))
    for i in range(p):
        label = f"i = {i + 1}" if i < 6 or i == p - 1 else None
        ax.plot(alphas, q[:, i], "o-", ms=3, color=colors[i], label=label)
        if alphas[0] <= lead[i] <= alphas[-1]:
            ax.axvline(lead[i], color=colors[i], ls="--", lw=0.8)
        if np.isfinite(fin[i]) and alphas[0] <= fin[i] <= alphas[-1]:
            ax.axvline(fin[i], color=colors[i], ls=":", lw=0.8)
    s = res["settings"]
    ax.set(xlabel="log_d n", ylabel="squared overlap q_i", ylim=(-0.02, 1.02))
    ax.set_title(f"{s['features']} features, d = {s['d']}, p = {s['p']}, gamma = {s['gamma']} "
                 f"(-- 2 + 2 gamma log_d i, : finite-d)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return save(fig, path, tight=True)


def plot_nmse(result: Result, path: Union[str, Path]) -> Path:
    """NMSE against n for the spectral learner and kernel ridge, with the predicted power law, as a PNG at ``path``."""
    res = result if isinstance(result, dict) else result.to_dict()
    pred = res["prediction"]
    n = np.array([pt["n"] for pt in res["points"]], dtype=np.float64)
    nmse = _nan([pt["nmse"] for pt in res["points"]])
    kernel = _nan([pt["nmse_kernel"] for pt in res["points"]])
    tail = _nan(pred["nmse_tail"])
    fig, ax = new_axes((6.5, 4.5))
    ax.loglog(n, nmse, "o-", label="spectral (layer-wise)")
    if np.isfinite(kernel).any():
        ax.loglog(n, kernel, "s-", label="kernel ridge on inputs")
    floor = pred.get("kernel_floor")
    if floor is not None and 0.0 < floor < 1.0:
        ax.axhline(floor, color="tab:orange", ls=":", lw=1, label="kernel floor, d^2 << n << d^4")
    # The tail sum is the prediction once a feature is known (m >= 1), where its constant is fitted.
    known = np.array(pred["recovered_count"]) >= 1
    ok = np.isfinite(tail) & (tail > 0) & known
    if ok.any():
        ax.loglog(n[ok], tail[ok], "k--", lw=1, label=f"tail sum x {number_text(pred['tail_constant'], '.2g')}")
    fin = _nan(pred["nmse_finite_d"])
    ax.loglog(n[fin > 0], fin[fin > 0], "g-.", lw=1, label="finite-d overlaps, no fit")
    lo, hi = (_nan(pred["slope_alpha_range"]))
    d = res["settings"]["d"]
    if np.isfinite(lo) and np.isfinite(hi):
        # The asymptotic power law, anchored at the measured NMSE at the start of the range.
        grid = np.array([d**lo, d**hi])
        j = int(np.argmin(np.abs(n - d**lo)))
        ax.loglog(grid, nmse[j] * (grid / n[j]) ** pred["exponent"], "r:", lw=1.5,
                  label=f"n^{pred['exponent']:.2f} (slope fit {number_text(pred['fitted_slope'], '.2g')})")
    ax.set(xlabel="n", ylabel="test NMSE")
    ax.legend(fontsize=8)
    return save(fig, path, tight=True)


def write_figures(result: Result, directory: Union[str, Path]) -> list[Path]:
    """Write ``hierarchical_overlaps.png`` and ``hierarchical_nmse.png`` into ``directory``."""
    out = Path(directory)  # created by the first write
    return [plot_overlaps(result, out / "hierarchical_overlaps.png"), plot_nmse(result, out / "hierarchical_nmse.png")]
