"""Where to stop: the recommendation rule on a run's h_t trajectory, and λ calibration across runs.

The rule (docs/math.md §3): training drives h = κ/β down through h*(λ); a checkpoint with h > h* is on
the under-fit side, one with h ≤ h* on the over-fit side. The recommended checkpoint is the FIRST,
in step order, with h_t ≤ h*(λ). With several layers the run-level statistic is the median over
the layers (whose fit succeeded) of log(h/h*); a single layer gives exactly h_t ≤ h*(λ).

Because h*(λ) = h*(1)/λ for every κ, γ and gap (h* = 2γκ / [λ(κ + 2γ·βτ)]), a checkpoint passes at
λ iff λ ≤ λ_c,t = exp(−median log(h/h*(1))): the stopping step grows with λ, and one fit per
checkpoint serves every λ. If no checkpoint passes, the last one is kept (the run is still
under-fit); checkpoints with no finite statistic are never recommended.

An identity worth knowing when reading results: h/h*(1) = κ/(2γβ) + τ, the mean of the fitted HTMP
law, so for one layer h ≤ h*(λ) ⟺ E_HTMP[e] ≤ 1/λ. The rule therefore stops at the first
checkpoint whose (fitted) mean eigenvalue — about ‖W‖²_F / p — is at most 1/λ: it can only fire
when that scale falls below the threshold (measured in ``benchmarks/dynamics``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from wbfe.errors import InvalidOptionError

__all__ = [
    "Recommendation",
    "CalibratedRun",
    "Calibration",
    "layer_statistic",
    "critical_lambda",
    "recommend",
    "lambda_grid",
    "calibrate_lambda",
]


@dataclass(frozen=True)
class Recommendation:
    """The checkpoint to keep.

    Attributes:
        index: its position in the run (step order); None when no checkpoint could be judged.
        step: its step; None when no checkpoint could be judged.
        crossed: True when h ≤ h* there (False: the run never crossed and the last one is kept).
        reason: one sentence saying why.
    """

    index: Optional[int]
    step: Optional[int]
    crossed: bool
    reason: str


def layer_statistic(h: np.ndarray, h_star: np.ndarray) -> np.ndarray:
    """Per checkpoint, the median over layers of log(h/h*), NaN where no layer has a finite ratio.

    Args:
        h: (checkpoints, layers) array of h = κ/β.
        h_star: the matching h* values (at one λ).

    Returns:
        A (checkpoints,) array; ≤ 0 means the checkpoint is on the over-fit side.
    """
    h = np.atleast_2d(np.asarray(h, dtype=float))
    h_star = np.atleast_2d(np.asarray(h_star, dtype=float))
    if h.shape != h_star.shape:
        raise InvalidOptionError(f"h and h* shapes differ: {h.shape} vs {h_star.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log(h / h_star)
    ratio[~np.isfinite(ratio)] = np.nan
    out = np.full(h.shape[0], np.nan)
    for t, row in enumerate(ratio):
        finite = row[np.isfinite(row)]
        if finite.size:
            out[t] = float(np.median(finite))
    return out


def critical_lambda(h: np.ndarray, h_star_at_1: np.ndarray) -> np.ndarray:
    """λ_c,t: the largest λ at which checkpoint t is on the over-fit side (NaN where unknown).

    Args:
        h: (checkpoints, layers) array of h.
        h_star_at_1: the matching h*(λ = 1).
    """
    return np.exp(-layer_statistic(h, h_star_at_1))


def recommend(steps: Sequence[int], crit: np.ndarray, lam: float) -> Recommendation:
    """Apply the rule at prior precision ``lam``.

    Args:
        steps: the checkpoints' steps, increasing.
        crit: their critical λ (:func:`critical_lambda`).
        lam: the prior precision λ > 0.

    Returns:
        The first checkpoint with λ ≤ λ_c,t (i.e. h_t ≤ h*(λ)), else the last judged one.

    Raises:
        InvalidOptionError: ``lam`` not positive, or ``steps`` and ``crit`` of different lengths.
    """
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam > 0):
        raise InvalidOptionError(f"lambda must be a positive number, not {lam!r}")
    crit = np.asarray(crit, dtype=float)
    if len(steps) != crit.size:
        raise InvalidOptionError(f"{len(steps)} steps but {crit.size} statistics")
    judged = np.flatnonzero(np.isfinite(crit))
    if judged.size == 0:
        return Recommendation(None, None, False, "no checkpoint has a finite h/h* (no HTMP fit of the selected "
                              "layers: failed, or too few eigenvalues)")
    ratio = lambda i: float(lam / crit[i])  # noqa: E731 - median h/h*(λ) at checkpoint i
    passing = [int(i) for i in judged if lam <= crit[i]]
    if not passing:
        last = int(judged[-1])
        return Recommendation(last, int(steps[last]), False,
                              f"h > h*(λ={lam:.4g}) at every checkpoint (under-fit throughout; "
                              f"last h/h* = {ratio(last):.3g}): the last checkpoint is kept")
    first = passing[0]
    if first == int(judged[0]):
        return Recommendation(first, int(steps[first]), True,
                              f"h ≤ h*(λ={lam:.4g}) already at the first checkpoint (h/h* = {ratio(first):.3g}): "
                              "on the over-fit side from the start")
    before = int(judged[judged < first][-1])
    return Recommendation(first, int(steps[first]), True,
                          f"first checkpoint with h ≤ h*(λ={lam:.4g}): h/h* = {ratio(first):.3f} "
                          f"(step {int(steps[before])}: {ratio(before):.3f})")


def lambda_grid(crits: Sequence[np.ndarray], n: int = 81) -> np.ndarray:
    """A log-spaced λ grid covering every critical λ of the given runs, with a factor 2 margin.

    Raises:
        InvalidOptionError: no finite critical λ at all, or ``n`` < 2.
    """
    if n < 2:
        raise InvalidOptionError(f"a lambda grid needs at least 2 points, not {n}")
    values = np.concatenate([np.asarray(c, dtype=float).ravel() for c in crits]) if crits else np.array([])
    values = values[np.isfinite(values) & (values > 0)]
    if values.size == 0:
        raise InvalidOptionError("no finite h/h* in any run: cannot build a lambda grid")
    return np.geomspace(values.min() / 2.0, values.max() * 2.0, n)


@dataclass(frozen=True)
class CalibratedRun:
    """One held-out run: the λ chosen on the others and what it gives on this one."""

    name: str
    lam: float
    recommended_step: Optional[int]
    best_step: int
    recommended_loss: float
    best_loss: float

    @property
    def gap(self) -> float:
        """Test loss at the recommended checkpoint minus the lowest test loss of the run."""
        return self.recommended_loss - self.best_loss


@dataclass(frozen=True)
class Calibration:
    """Leave-one-run-out λ calibration.

    Attributes:
        grid: the λ values tried.
        mean_gap: mean test-loss gap over all runs at each grid λ (the in-sample curve).
        lam_all: λ chosen on all runs (to apply to new runs).
        held_out: one entry per run, λ chosen without it.
    """

    grid: np.ndarray
    mean_gap: np.ndarray
    lam_all: float
    held_out: tuple[CalibratedRun, ...] = field(default=())


def _gaps(steps: Sequence[int], crit: np.ndarray, loss: np.ndarray, grid: np.ndarray) -> np.ndarray:
    best = float(np.nanmin(loss))
    out = np.empty(grid.size)
    for k, lam in enumerate(grid):
        rec = recommend(steps, crit, float(lam))
        out[k] = loss[rec.index] - best if rec.index is not None else np.nan
    return out


def _middle(means: np.ndarray) -> int:
    # Ties (flat stretches) are common on a fine grid: take the middle of the minimising set.
    best = np.flatnonzero(means <= np.nanmin(means) + 1e-12)
    return int(best[len(best) // 2])


def _choose(grid: np.ndarray, gaps: np.ndarray) -> float:
    return float(grid[_middle(np.nanmean(gaps, axis=0))])


def calibrate_lambda(
    names: Sequence[str],
    steps: Sequence[Sequence[int]],
    crits: Sequence[np.ndarray],
    losses: Sequence[np.ndarray],
    *,
    grid: Optional[np.ndarray] = None,
) -> Calibration:
    """Choose λ from a log grid by leave-one-run-out, minimising the mean test-loss gap.

    Args:
        names: run names.
        steps: each run's steps.
        crits: each run's critical λ per checkpoint.
        losses: each run's test loss per checkpoint (all finite).
        grid: λ values to try; default :func:`lambda_grid` of ``crits``.

    Returns:
        A :class:`Calibration`.

    Raises:
        InvalidOptionError: fewer than two runs, mismatched lengths, or a run without test losses.
    """
    if len(names) < 2:
        raise InvalidOptionError(f"leave-one-run-out calibration needs at least 2 runs, got {len(names)}")
    if not (len(names) == len(steps) == len(crits) == len(losses)):
        raise InvalidOptionError("names, steps, critical lambdas and losses must have one entry per run")
    losses = [np.asarray(x, dtype=float) for x in losses]
    for name, s, loss in zip(names, steps, losses):
        if loss.size != len(s) or not np.all(np.isfinite(loss)):
            raise InvalidOptionError(f"run {name}: every checkpoint needs a finite test_loss")
    grid = lambda_grid(crits) if grid is None else np.asarray(grid, dtype=float)
    gaps = np.array([_gaps(s, np.asarray(c, dtype=float), loss, grid) for s, c, loss in zip(steps, crits, losses)])
    held = []
    for r, name in enumerate(names):
        others = np.delete(gaps, r, axis=0)
        lam = _choose(grid, others)
        rec = recommend(steps[r], crits[r], lam)
        best = int(np.argmin(losses[r]))
        held.append(CalibratedRun(
            name=name, lam=lam,
            recommended_step=rec.step,
            best_step=int(steps[r][best]),
            recommended_loss=float(losses[r][rec.index]) if rec.index is not None else math.nan,
            best_loss=float(losses[r][best]),
        ))
    return Calibration(grid=grid, mean_gap=np.nanmean(gaps, axis=0), lam_all=_choose(grid, gaps), held_out=tuple(held))
