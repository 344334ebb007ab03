"""What a watch result can and cannot say: why a column is NaN, which layers can carry h_t, BFE-W at a fixed λ.

BFE-W at λ* follows the weights' scale, so across one run it is read at one fixed λ (docs/watch.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["bfe_at", "bfe_at_many", "FixedLambdaTrend", "fixed_lambda_trend", "nan_notes", "fittable_hint",
           "describe_trend", "BFE_OPT_CAVEAT", "run_mean"]

BFE_OPT_CAVEAT = ("BFE-W at λ* (the bfe column without --lambda) is not expected to fall over one run's epochs: "
                  "λ* = 1/mean(e) follows the weights' scale, so tracking one run needs λ fixed afterwards "
                  "(the BFE-W paper); the stopping signal is h_t against h*(λ)")

# The columns that an HTMP-fit or α failure leaves NaN, named as the table names them.
_FIT_COLUMNS = "htmp_kappa, htmp_beta, htmp_tau, h, h_star, f_inf, alpha"


def bfe_at(f_star: float, lambda_star: float, lam: float) -> float:
    """BFE-W at prior precision λ from F* (``+inf``: rank-deficient) and λ* = 1/mean(e):
    F^λ = F* + ½·(r − 1 − log r), r = λ/λ* (NaN when an input is NaN, or λ or λ* is not positive and finite,
    as :func:`bfe_at_many`).

    Example:
        >>> bfe_at(1.0, 2.0, 2.0)  # at λ* itself
        1.0
        >>> round(bfe_at(1.0, 2.0, 4.0), 9)  # r = 2: 1 + ½·(1 − log 2)
        1.15342641
    """
    if not (0.0 < lam < math.inf and 0.0 < lambda_star < math.inf):  # λ* = 0 raised ZeroDivisionError, ∞ ValueError
        return math.nan
    r = lam / lambda_star
    return f_star + 0.5 * (r - 1.0 - math.log(r))


def bfe_at_many(f_star: np.ndarray, lambda_star: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """:func:`bfe_at` elementwise over broadcastable arrays (NaN where an input is NaN or λ* ≤ 0)."""
    f_star, lambda_star, lam = (np.asarray(x, dtype=float) for x in (f_star, lambda_star, lam))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = lam / lambda_star
        out = f_star + 0.5 * (r - 1.0 - np.log(r))
    out[~(r > 0)] = np.nan
    return out


@dataclass(frozen=True)
class FixedLambdaTrend:
    """BFE-W at one fixed λ per layer across a run, beside BFE-W at each checkpoint's λ*.

    Attributes:
        source: ``given`` (one λ for every layer) or ``last checkpoint`` (each layer's λ* there).
        source_step: the step the λ values were taken at (None when given).
        bfe, bfe_opt: (checkpoints, layers) BFE-W at the fixed λ and at λ*.
        run_bfe, run_bfe_opt: per checkpoint, the mean over the layers finite at every checkpoint.
    """

    source: str
    source_step: Optional[int]
    lambdas: dict[str, float]
    steps: tuple[int, ...]
    bfe: np.ndarray
    bfe_opt: np.ndarray
    run_bfe: np.ndarray
    run_bfe_opt: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape (non-finite numbers are turned into null by the caller's ``json_ready``)."""
        trend = [{"step": s, "bfe": float(b), "bfe_opt": float(o)}
                 for s, b, o in zip(self.steps, self.run_bfe, self.run_bfe_opt)]
        return {"lambda_source": self.source, "lambda_step": self.source_step,
                "lambdas": {k: float(v) for k, v in self.lambdas.items()}, "trend": trend,
                "summary": describe_trend(self.steps, self.run_bfe), "note": BFE_OPT_CAVEAT}


def run_mean(values: np.ndarray) -> np.ndarray:
    # The same layers at every checkpoint, so the run-level numbers are comparable along the run.
    keep = np.all(np.isfinite(values), axis=0)
    return values[:, keep].mean(axis=1) if keep.any() else np.full(values.shape[0], np.nan)


def fixed_lambda_trend(steps: Sequence[int], names: Sequence[str], bfe_opt: np.ndarray,
                       lambda_star: np.ndarray, lam: Optional[float] = None) -> FixedLambdaTrend:
    """BFE-W of every (checkpoint, layer) at one λ per layer, from (checkpoints, layers) F* and λ* alone: ``lam``
    for every layer, or (None) each layer's λ* at the last checkpoint where it is finite."""
    bfe_opt = np.asarray(bfe_opt, dtype=float).reshape(len(steps), len(names))
    lambda_star = np.asarray(lambda_star, dtype=float).reshape(bfe_opt.shape)
    if lam is not None:
        fixed = np.full(len(names), float(lam))
        source, source_step = "given", None
    else:
        usable = [np.flatnonzero(column) for column in (np.isfinite(lambda_star) & (lambda_star > 0)).T]
        fixed = np.array([lambda_star[rows[-1], j] if rows.size else np.nan for j, rows in enumerate(usable)])
        last_row = max((int(rows[-1]) for rows in usable if rows.size), default=-1)
        source, source_step = "last checkpoint", int(steps[last_row]) if last_row >= 0 else None
    values = bfe_at_many(bfe_opt, lambda_star, fixed[None, :])
    return FixedLambdaTrend(source, source_step, dict(zip(names, fixed.tolist())), tuple(int(s) for s in steps),
                            values, bfe_opt, run_mean(values), run_mean(bfe_opt))


def describe_trend(steps: Sequence[int], values: np.ndarray) -> str:
    """One line: first and last finite value, the change, and at how many steps it fell."""
    values = np.asarray(values, dtype=float)
    finite = np.flatnonzero(np.isfinite(values))
    if finite.size == 0:
        return "no finite value"
    first, last = int(finite[0]), int(finite[-1])
    if first == last:
        return f"step {steps[first]}: {values[first]:.6g} (one checkpoint)"
    diffs = np.diff(values[finite])
    return (f"step {steps[first]} {values[first]:.6g} → step {steps[last]} {values[last]:.6g} "
            f"({values[last] - values[first]:+.4g}; falls at {int(np.sum(diffs < 0))} of {diffs.size} steps)")


def _layer_reason(layer: Any) -> str:
    fallback = "the HTMP fit did not converge" if not math.isfinite(layer.kappa) else "h = κ/β is not finite"
    return next((str(layer.reasons[k]) for k in ("h", "htmp_kappa", "htmp_beta", "alpha") if layer.reasons.get(k)),
                fallback)


def nan_notes(points: Sequence[Any]) -> tuple[dict[tuple[int, str], int], list[str]]:
    """Why h is NaN, per (checkpoint, layer) of the run's points, grouped into numbered notes: ``(marks, notes)``,
    ``marks[(checkpoint index, layer name)]`` the 1-based note number, ``notes[k - 1]`` note k's text."""
    keys: dict[tuple[str, str], list[int]] = {}
    for t, point in enumerate(points):
        for layer in point.layers:
            if not math.isfinite(layer.h):
                keys.setdefault((layer.name, _layer_reason(layer)), []).append(t)
    numbered = list(enumerate(keys.items(), start=1))
    marks = {(t, name): k for k, ((name, _), where) in numbered for t in where}
    return marks, [f"[{k}] {name} ({len(where)} of {len(points)} checkpoints): {_FIT_COLUMNS} are NaN — {reason}"
                   for k, ((name, reason), where) in numbered]


def fittable_hint(points: Sequence[Any], layers: str) -> Optional[str]:
    """One sentence naming the matrices that can carry h_t when some selected layer has too few eigenvalues, else
    None."""
    if not points:
        return None
    last = points[-1]
    short = [layer for layer in last.layers if 0 < layer.n_eigs < last.min_eigs]
    if not short or layers == "fittable":
        return None
    what = ", ".join(f"{layer.name} has {layer.n_eigs}" for layer in short)
    head = f"too few eigenvalues for an HTMP fit ({what}; the fit needs min_eigs={last.min_eigs})"
    if not last.fittable:
        return head + "; no matrix of this checkpoint has enough: h_t cannot be followed, only BFE-W"
    listed = ", ".join(f"{name} ({n})" for name, n in last.fittable[:8]) + (" ..." if len(last.fittable) > 8 else "")
    return f"{head}; the matrices that can carry h_t: {listed} — rerun with --layers fittable"
