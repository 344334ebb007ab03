"""How much each matrix changed, along the depth of the model (``wbfe compare --output DIR``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from wbfe.render.text import as_float
from wbfe.reporting.plots.canvas import new_figure, save

__all__ = ["plot_change_along_depth"]


def plot_change_along_depth(comparison: Any, path: Path) -> Path:
    """A PNG at ``path`` of two panels against the block index parsed from each name (stream order where names
    have none): the relative Frobenius change ‖B − A‖/‖A‖ (log scale; linear, said in the panel, where no matrix
    changed) and the Wasserstein-1 distance between the log-spectra; one marker per matrix, coloured by role, with
    the per-block mean."""
    rows = comparison.layers
    with_depth = all(row.get("depth") is not None for row in rows)
    x = np.array([row["depth"] if with_depth else i for i, row in enumerate(rows)], dtype=float)
    roles = np.array([row["role"] for row in rows])
    fig = new_figure((9, 6.5), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    for ax, column, label, log in ((axes[0], "rel_frobenius", "‖B − A‖_F / ‖A‖_F", True),
                                   (axes[1], "w1_log_eigs", "W1 between log-spectra", False)):
        y = np.array([as_float(row.get(column)) for row in rows])
        if log and not np.any(y > 0):  # a log axis of no positive value is matplotlib's warning and an empty panel
            log = False
            ax.text(0.5, 0.5, "no positive values: drawn on a linear scale", ha="center", va="center",
                    transform=ax.transAxes)
        for role in sorted(set(roles)):
            mask = (roles == role) & np.isfinite(y) & ((y > 0) if log else True)
            if mask.any():
                ax.scatter(x[mask], y[mask], s=14, alpha=0.7, label=role)
        if with_depth:
            depths = np.unique(x)
            means = [np.nanmean(y[x == d]) if np.isfinite(y[x == d]).any() else math.nan for d in depths]
            ax.plot(depths, means, color="black", lw=1, label="mean per block")
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=3)
    axes[1].set_xlabel("block (from the tensor name)" if with_depth else "matrix (stream order)")
    fig.suptitle(f"{comparison.model_b.get('source')} vs {comparison.model_a.get('source')}", fontsize=10)
    return save(fig, path)

