"""Where to stop: the h* rule on a run's h_t trajectory, and λ calibration across runs (docs/watch.md).

Since h*(λ) = h*(1)/λ, a checkpoint passes iff λ ≤ λ_c,t = exp(−median log(h/h*(1))): one fit serves every λ.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from wbfe.errors import InvalidOptionError

__all__ = ["Recommendation", "CalibratedRun", "Calibration", "layer_statistic", "critical_lambda", "recommend",
           "calibrate_lambda", "middle_of_ties"]


@dataclass(frozen=True)
class Recommendation:
    """The checkpoint to keep (``index``, ``step``: None when none could be judged), whether h ≤ h* there
    (False: never crossed, the last one is kept) and why."""

    index: Optional[int]
    step: Optional[int]
    crossed: bool
    reason: str


def layer_statistic(h: np.ndarray, h_star: np.ndarray) -> np.ndarray:
    """Per checkpoint, the median over layers of log(h/h*) from (checkpoints, layers) arrays, NaN where no layer
    has a finite ratio; ≤ 0 means the checkpoint is on the over-fit side."""
    h, h_star = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (h, h_star))
    if h.shape != h_star.shape:
        raise InvalidOptionError(f"h and h* shapes differ: {h.shape} vs {h_star.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log(h / h_star)
    ratio[~np.isfinite(ratio)] = np.nan
    with warnings.catch_warnings():  # an all-NaN checkpoint is NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(ratio, axis=1) if ratio.shape[1] else np.full(h.shape[0], np.nan)


def critical_lambda(h: np.ndarray, h_star_at_1: np.ndarray) -> np.ndarray:
    """λ_c,t: the largest λ at which checkpoint t is on the over-fit side (NaN where unknown)."""
    return np.exp(-layer_statistic(h, h_star_at_1))


def recommend(steps: Sequence[int], crit: np.ndarray, lam: float) -> Recommendation:
    """The first checkpoint with λ ≤ λ_c,t (h_t ≤ h*(λ)) at prior precision ``lam``, else the last judged one.

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
        return Recommendation(last, int(steps[last]), False, f"h > h*(λ={lam:.4g}) at every checkpoint (under-fit "
                              f"throughout; last h/h* = {ratio(last):.3g}): the last checkpoint is kept")
    first = passing[0]
    if first == int(judged[0]):
        return Recommendation(first, int(steps[first]), True, f"h ≤ h*(λ={lam:.4g}) already at the first checkpoint "
                              f"(h/h* = {ratio(first):.3g}): on the over-fit side from the start")
    before = int(judged[judged < first][-1])
    return Recommendation(first, int(steps[first]), True, f"first checkpoint with h ≤ h*(λ={lam:.4g}): h/h* = "
                          f"{ratio(first):.3f} (step {int(steps[before])}: {ratio(before):.3f})")


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
    """Leave-one-run-out λ calibration: the λ grid, the mean test-loss gap over all runs at each (in-sample), the λ
    chosen on all runs (for new runs), and per run the λ chosen without it."""

    grid: np.ndarray
    mean_gap: np.ndarray
    lam_all: float
    held_out: tuple[CalibratedRun, ...] = field(default=())


def _gaps(steps: Sequence[int], crit: np.ndarray, loss: np.ndarray, grid: np.ndarray) -> np.ndarray:
    best = float(np.nanmin(loss))
    chosen = [recommend(steps, crit, float(lam)).index for lam in grid]
    return np.array([loss[i] - best if i is not None else np.nan for i in chosen], dtype=float)


def middle_of_ties(means: np.ndarray) -> int:
    # Ties (flat stretches) are common on a fine grid: take the middle of the minimising set.
    best = np.flatnonzero(means <= np.nanmin(means) + 1e-12)
    return int(best[len(best) // 2])


def _choose(grid: np.ndarray, gaps: np.ndarray) -> float:
    return float(grid[middle_of_ties(np.nanmean(gaps, axis=0))])


def calibrate_lambda(names: Sequence[str], steps: Sequence[Sequence[int]], crits: Sequence[np.ndarray],
                     losses: Sequence[np.ndarray], *, grid: Optional[np.ndarray] = None) -> Calibration:
    """Choose λ from a log grid (default: 81 points covering every critical λ of ``crits`` with a factor 2 margin)
    by leave-one-run-out, minimising the mean test-loss gap; per run its steps, critical λ and finite test losses
    per checkpoint.

    Raises:
        InvalidOptionError: fewer than two runs, mismatched lengths, a run without test losses, or (default grid) no
            finite critical λ at all.
    """
    if len(names) < 2:
        raise InvalidOptionError(f"leave-one-run-out calibration needs at least 2 runs, got {len(names)}")
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:  # its copy would stay in while it is held out: a gap of 0 by construction
        raise InvalidOptionError(f"run {twice[0]} is listed twice: leave-one-run-out needs each run once")
    if not (len(names) == len(steps) == len(crits) == len(losses)):
        raise InvalidOptionError("names, steps, critical lambdas and losses must have one entry per run")
    losses = [np.asarray(x, dtype=float) for x in losses]
    for name, s, loss in zip(names, steps, losses):
        if loss.size != len(s) or not np.all(np.isfinite(loss)):
            raise InvalidOptionError(f"run {name}: every checkpoint needs a finite test_loss")
    if grid is None:
        values = np.concatenate([np.asarray(c, dtype=float).ravel() for c in crits])
        values = values[np.isfinite(values) & (values > 0)]
        if values.size == 0:
            raise InvalidOptionError("no finite h/h* in any run: cannot build a lambda grid")
        grid = np.geomspace(values.min() / 2.0, values.max() * 2.0, 81)
    grid = np.asarray(grid, dtype=float)
    gaps = np.array([_gaps(s, np.asarray(c, dtype=float), loss, grid) for s, c, loss in zip(steps, crits, losses)])
    held = []
    for r, name in enumerate(names):
        lam = _choose(grid, np.delete(gaps, r, axis=0))
        rec = recommend(steps[r], crits[r], lam)
        best = int(np.argmin(losses[r]))
        kept = float(losses[r][rec.index]) if rec.index is not None else math.nan
        held.append(CalibratedRun(name, lam, rec.step, int(steps[r][best]), kept, float(losses[r][best])))
    return Calibration(grid=grid, mean_gap=np.nanmean(gaps, axis=0), lam_all=_choose(grid, gaps), held_out=tuple(held))
