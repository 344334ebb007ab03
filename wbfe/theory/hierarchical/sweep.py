"""Theory II (docs/math.md §7) simulated: a sweep of n = d^α, for several seeds, comparing the spectral
learner and kernel ridge with the predictions. Per seed a teacher is drawn once with one nested training
set (each n uses the first n samples of the largest draw) and one test set.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

from wbfe.options import refuse_keywords
from wbfe.render.text import json_ready
from wbfe.theory.hierarchical import theory
from wbfe.theory.hierarchical.kernel import fit_kernel_ridge, predict_kernel_ridge
from wbfe.theory.hierarchical.model import HierarchicalTeacher, make_teacher, sample_data
from wbfe.theory.hierarchical.settings import HierarchicalSettings
from wbfe.theory.hierarchical.spectral import fit_spectral, matched_overlaps, predict_spectral

__all__ = ["HierarchicalPoint", "HierarchicalResult", "simulate_hierarchical"]


@dataclass(frozen=True)
class HierarchicalPoint:
    """Measurements at one sample size, averaged over seeds.

    Attributes:
        alpha: log_d n as asked (n is its rounding).
        nmse: spectral learner's test MSE / Var(y_test), mean over seeds (``nmse_std``: its spread).
        nmse_kernel: kernel ridge's NMSE, trained on min(n, kernel_max_n) = ``n_kernel`` samples (NaN
            when the baseline is switched off).
        q: (p,) mean squared overlap of each teacher direction with its matched learned direction.
        recovered: mean number of features with q_i >= the recovery level.
    """

    alpha: float
    n: int
    nmse: float
    nmse_std: float
    nmse_kernel: float
    n_kernel: int
    q: tuple[float, ...]
    recovered: float


@dataclass(frozen=True)
class HierarchicalResult:
    """A sweep: its settings, its points, and the predictions set against them."""

    settings: dict[str, Any]
    points: tuple[HierarchicalPoint, ...]
    prediction: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes None): ``{"settings", "points", "prediction"}``."""
        return json_ready({"settings": self.settings, "points": [asdict(p) for p in self.points],
                         "prediction": self.prediction})


def simulate_hierarchical(settings: Optional[HierarchicalSettings] = None, /, **options: Any) -> HierarchicalResult:
    """Sweep n = d^α and measure the spectral learner against kernel ridge and the predictions.

    Give the :class:`~wbfe.theory.hierarchical.settings.HierarchicalSettings`, or their fields as keywords
    (``simulate_hierarchical(d=30, seeds=2)``).

    Raises:
        InvalidOptionError: an option out of range (or both ``settings`` and keywords given).
        UnknownNameError: unknown activation, feature kind or solver.
    """
    if settings is None:
        settings = HierarchicalSettings(**options)
    else:  # every keyword in **options was given, even one equal to its default: none is unset
        refuse_keywords(HierarchicalSettings, options, defaults=dict.fromkeys(options, object()),
                        why="pass the settings either as HierarchicalSettings(...) or as keywords, not both")
    s = settings
    alphas, ns = s.alphas(), s.sample_sizes()
    runs = [_run_seed(child, ns, s) for child in np.random.SeedSequence(s.seed).spawn(s.seeds)]
    # (seeds, points) arrays, and (seeds, points, p) for q
    nmse, q, kernel, recovered = (np.array([r[key] for r in runs]) for key in ("nmse", "q", "nmse_kernel", "recovered"))
    pts = tuple(HierarchicalPoint(alpha=float(alphas[j]), n=ns[j], nmse=float(nmse[:, j].mean()),
                                  nmse_std=float(nmse[:, j].std()), nmse_kernel=float(kernel[:, j].mean()),
                                  n_kernel=min(ns[j], s.kernel_max_n), q=tuple(float(v) for v in q[:, j].mean(axis=0)),
                                  recovered=float(recovered[:, j].mean())) for j in range(len(ns)))
    prediction = _predictions([r["teacher"] for r in runs], alphas, ns, pts, gamma=s.gamma, q_level=s.q_level)
    return HierarchicalResult(s.to_dict(p=runs[0]["teacher"].p), pts, prediction)


def _run_seed(child: np.random.SeedSequence, ns: list[int], s: HierarchicalSettings) -> dict[str, Any]:
    s_teacher, s_train, s_test, s_eig = child.spawn(4)
    teacher = make_teacher(s.d, p=s.p, gamma=s.gamma, eps=s.eps, activation=s.activation, features=s.features,
                           seed=s_teacher)
    train, y_train = sample_data(teacher, ns[-1], seed=s_train)
    test, y_test = sample_data(teacher, s.n_test, seed=s_test)
    var_test = float(np.var(y_test))
    eig_seed = int(s_eig.generate_state(1)[0])
    out: dict[str, Any] = {"teacher": teacher, "nmse": [], "q": [], "recovered": [], "nmse_kernel": []}

    @functools.cache  # every n >= kernel_max_n trains on the same prefix
    def kernel_nmse(n_k: int) -> float:
        if n_k < 2:
            return math.nan  # baseline switched off
        kfit = fit_kernel_ridge(train.inputs[:n_k], y_train[:n_k])
        return float(np.mean((predict_kernel_ridge(kfit, test.inputs) - y_test) ** 2)) / var_test

    for n in ns:
        data, y = train.head(n), y_train[:n]
        fit = fit_spectral(data, y, min(teacher.p, data.dim - 1), solver=s.solver, seed=eig_seed)
        q = matched_overlaps(teacher.a, fit.directions)
        out["q"].append(q)
        out["recovered"].append(int(np.count_nonzero(q >= s.q_level)))
        out["nmse"].append(float(np.mean((predict_spectral(fit, test) - y_test) ** 2)) / var_test)
        out["nmse_kernel"].append(kernel_nmse(min(n, s.kernel_max_n)))
    return out


def _predictions(teachers: list[HierarchicalTeacher], alphas: np.ndarray, ns: list[int],
                 pts: tuple[HierarchicalPoint, ...], *, gamma: float, q_level: float) -> dict[str, Any]:
    teacher = teachers[0]  # |b_i| is the same for every seed; only the signs differ
    d, p = teacher.d, teacher.p
    # For a non-linear g* the constants depend on the signs: use root mean squares over seeds.
    moments = [theory.spike_strengths(t.b, t.activation, t.y_mean, t.y_std) for t in teachers]
    c = np.sqrt(np.mean([m[0] ** 2 for m in moments], axis=0))
    v = np.mean([m[1] for m in moments], axis=0)
    onset = theory.finite_d_thresholds(d, c, v)
    half_pred = theory.finite_d_level_alphas(d, c, v, q_level)
    half_meas = theory.crossing_alphas(alphas, np.array([pt.q for pt in pts]), q_level)
    q_fin = [theory.finite_d_overlaps(n, d, c, v) for n in ns]
    m_lead = [theory.recovered_count(a, d, gamma, p) for a in alphas]
    m_fin = [int(np.count_nonzero(q >= q_level)) for q in q_fin]
    nmse = np.array([pt.nmse for pt in pts])
    nmse_fin = np.array([theory.overlap_nmse(q, teacher.b) for q in q_fin])
    tails = np.array([theory.tail_fraction(m, teacher.b) for m in m_lead])
    # Feature-learning range: from the first predicted recovery (finite-d model, q >= q_level) to
    # half of the features, so that neither the flat start nor the finite-p end of the tail sum
    # dominates the slope; the tail constant is fitted there too.
    in_range = np.array([1 <= m <= max(1, p // 2) for m in m_fin])
    const = theory.fit_tail_constant(nmse[in_range], tails[in_range])
    n_arr = np.array(ns, dtype=np.float64)
    fitted = theory.loglog_slope(n_arr[in_range], nmse[in_range])
    top = max(1, p // 2)
    why = "" if not math.isnan(fitted) else (
        f"{int(in_range.sum())} point(s) with 1 to {top} feature(s) recovered by the finite-d prediction (it has "
        f"{m_fin[0]} at alpha {alphas[0]:.3g} and {m_fin[-1]} at {alphas[-1]:.3g}), of more than one n; 2 are "
        "needed: move or widen --alpha-min/--alpha-max, or raise --points")
    return {
        "alpha_thresholds": theory.leading_thresholds(d, p, gamma), "alpha_thresholds_finite_d": onset,
        # The measured onset: the measured half-overlap point moved by the predicted onset-to-half gap.
        "alpha_thresholds_measured": half_meas - (half_pred - onset),
        "alpha_half_predicted": half_pred, "alpha_half_measured": half_meas, "q_level": q_level,
        "spike_strengths": c, "couplings": v, "b": teacher.b,
        "recovered_count": m_lead, "recovered_count_finite_d": m_fin, "q_finite_d": q_fin, "nmse_finite_d": nmse_fin,
        "nmse_from_q": [theory.overlap_nmse(np.array(pt.q), teacher.b) for pt in pts],
        "tail_constant": const, "nmse_tail": const * tails, "exponent": theory.nmse_exponent(gamma),
        # What kernel ridge on the raw inputs can reach for d² ≪ n ≪ d⁴ (mean over seeds).
        "kernel_floor": float(np.mean([theory.kernel_floor(t.a, t.b, d, features=t.features,
                                                           activation=t.activation) for t in teachers])),
        "slope_alpha_range": [float(alphas[in_range].min()), float(alphas[in_range].max())]
        if in_range.any() else [math.nan, math.nan],
        "fitted_slope": fitted,
        "slope_reason": why,  # why the fitted slope is NaN ("" when it is not)
        "tail_slope": theory.loglog_slope(n_arr[in_range], tails[in_range]),
        "finite_d_slope": theory.loglog_slope(n_arr[in_range], nmse_fin[in_range]),
    }
