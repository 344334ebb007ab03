"""Figures of a watched run: h_t against h*, κ_t and β_t, BFE-W, and the test metric, with the kept checkpoint marked."""

from __future__ import annotations

import math
from itertools import cycle
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np

if TYPE_CHECKING:
    from wbfe.watch import CalibrationReport, WatchResult

from wbfe.reporting.plots.canvas import new_axes, new_figure, save

__all__ = ["plot_watch", "plot_calibration"]


def _label(run: str) -> str:
    path = Path(run)
    return path.parent.name if path.suffix.lower() == ".csv" else (path.name or run)


def plot_watch(result: "WatchResult", path: Union[str, Path], *, dpi: int = 110) -> Path:
    """Save a 2×2 figure: h_t with h*(λ) per layer; κ_t and β_t; BFE-W at a fixed λ; test loss/accuracy (if known).

    BFE-W is drawn at the given λ, else at each layer's λ* of the last checkpoint (solid) beside its
    value at each checkpoint's own λ* (dotted), which is not expected to fall over one run. The
    recommended checkpoint is a vertical dashed line on every panel. Returns the path written.
    """
    import matplotlib

    traj = result.trajectory
    steps = np.array(traj.steps, dtype=float)
    lam = result.lam
    h, kappa, beta = (traj.matrix(attrgetter(name)) for name in ("h", "kappa", "beta"))
    fixed = result.fixed_lambda()  # BFE-W at one λ across the run (λ* moves with the weights' scale)
    h_star = traj.matrix(lambda x: x.h_star(lam)) if lam is not None else None
    rec = result.recommendation
    fig = new_figure((10.0, 7.0), layout="constrained")
    axes = fig.subplots(2, 2)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    twin = axes[0, 1].twinx()
    for j, (name, c) in enumerate(zip(traj.layer_names, cycle(colors))):
        axes[0, 0].plot(steps, h[:, j], "o-", ms=3, color=c, label=f"h  {name}")
        if h_star is not None:
            axes[0, 0].plot(steps, h_star[:, j], "--", color=c, alpha=0.7, label=f"h*(λ)  {name}")
        axes[0, 1].plot(steps, kappa[:, j], "o-", ms=3, color=c, label=f"κ  {name}")
        twin.plot(steps, beta[:, j], "s:", ms=3, color=c, alpha=0.7)
        axes[1, 0].plot(steps, fixed.bfe[:, j], "o-", ms=3, color=c, label=name)
        if lam is None:
            axes[1, 0].plot(steps, fixed.bfe_opt[:, j], ":", color=c, alpha=0.7)
    ax = axes[0, 0]
    if np.any(np.isfinite(h)):
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no HTMP fit (too few eigenvalues?):\nsee the notes of the table", ha="center",
                va="center", transform=ax.transAxes, fontsize=8)
    ax.set_title("h = κ/β" + (f" and h*(λ={lam:.3g})" if lam is not None else ""))
    ax.legend(fontsize=6)
    axes[0, 1].set(ylabel="κ", title="κ_t (solid) and β_t (dotted)")
    twin.set(ylabel="β (dotted)", yscale="log")
    axes[0, 1].legend(fontsize=6)
    axes[1, 0].set_title(f"BFE-W at λ={lam:.3g}" if lam is not None else
                         "BFE-W at the last checkpoint's λ* (dotted: at each λ*)", fontsize=9)
    axes[1, 0].legend(fontsize=6)
    ax = axes[1, 1]
    loss = traj.test_losses()
    acc = np.array([p.test_accuracy for p in traj.points], dtype=float)
    by_loss, by_acc = bool(np.any(np.isfinite(loss))), bool(np.any(np.isfinite(acc)))
    if by_loss or by_acc:  # accuracy alone is a test metric too: the best checkpoint is then the highest
        y, word, best = (loss, "loss", int(np.nanargmin(loss))) if by_loss else (acc, "accuracy", int(np.nanargmax(acc)))
        ax.plot(steps, y, "o-", ms=3, color="black", label=f"test {word}")
        ax.plot(steps[best], y[best], "*", ms=12, color="gold", mec="black",
                label=f"{'lowest' if by_loss else 'highest'} test {word}")
        ax.set_title("test metrics" if by_loss else "test metrics (accuracy; no test loss given)")
        if by_loss and by_acc:
            twin = ax.twinx()
            twin.plot(steps, acc, ".:", color="tab:gray")
            twin.set_ylabel("test accuracy (dotted)")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no test metrics given", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("test metrics")
    for ax in axes.ravel():
        ax.set_xlabel("step")
        if rec is not None and rec.step is not None:
            ax.axvline(rec.step, color="red", ls="--", lw=1)
    kept = "none" if rec is None or rec.step is None else str(rec.step)
    by = f" (rule {result.stopping['name']})" if result.stopping is not None else ""
    fig.suptitle(f"{_label(traj.run)}: recommended step {kept}{by}", fontsize=10)
    return save(fig, path, dpi=dpi)


def plot_calibration(report: "CalibrationReport", path: Union[str, Path], *, dpi: int = 110) -> Path:
    """Save the mean test-loss gap against λ (all runs), with each held-out run's chosen λ marked."""
    cal = report.calibration
    fig, ax = new_axes((6.0, 4.0), layout="constrained")
    ax.plot(cal.grid, cal.mean_gap, "-", color="black", label="mean gap, all runs")
    for run in cal.held_out:
        if math.isfinite(run.gap):
            ax.plot(run.lam, run.gap, "o", ms=5, label=f"{_label(run.name)}: held out")
    ax.axvline(cal.lam_all, color="red", ls="--", lw=1, label="λ chosen on all runs")
    ax.set(xscale="log", xlabel="λ", ylabel="test loss(recommended) − min test loss")
    ax.legend(fontsize=6)
    return save(fig, path, dpi=dpi)
