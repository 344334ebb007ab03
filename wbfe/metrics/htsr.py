"""HT-SR baselines: the WeightWatcher 0.7.7 metrics, computed from one spectrum (docs/math.md §4).

Every column is defined in docs/metrics.md, with WeightWatcher's per-slice rank_loss and sv_min, and which eigenvalues
each column keeps; what WeightWatcher's conventions change is in docs/spectral-metrics.md."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from wbfe.linalg.arrays import to_numpy
from wbfe.linalg.spectra import Spectrum
from wbfe.metrics._group import GroupResult, MetricGroup, MetricOptions, stored_threshold
from wbfe.metrics.mp import MPFit, mp_fit, mp_fit_many
from wbfe.metrics.powerlaw import PowerLawFit, failed_fit, fit_power_law, fit_truncated_power_law
from wbfe.options.conventions import WW_EVALS_THRESH

__all__ = ["MPFit", "mp_fit", "matrix_rank", "matrix_entropy", "fit_spectrum_power_law", "slice_singular_values",
           "WW_EVALS_THRESH", "WW_WEAK_RANK_TOL", "GROUP"]

#: WeightWatcher 0.7.7's ``tolerance``: eigenvalues below it count in ``weak_rank_loss``.
WW_WEAK_RANK_TOL = 1e-6
_LN10 = math.log(10.0)
_EPS = float(np.finfo(np.float64).eps)

COLUMNS = (
    "norm", "log_norm", "spectral_norm", "log_spectral_norm", "stable_rank", "matrix_rank", "entropy", "alpha", "sigma",
    "xmin", "num_pl_spikes", "alpha_weighted", "log_alpha_norm", "tpl_alpha", "tpl_lambda", "bulk_max", "num_spikes",
    "mp_softrank", "rank_loss", "weak_rank_loss", "sv_min", "lambda_max",
)


def matrix_rank(eigs: np.ndarray, P: int) -> int:
    """Number of singular values √e above max √e · P · ε(float64) (numpy's default tolerance)."""
    return _rank(np.sqrt(np.asarray(eigs, dtype=np.float64)), P)


def _rank(sv: np.ndarray, P: int) -> int:
    return int(np.count_nonzero(sv > float(np.max(sv, initial=0.0)) * P * _EPS))


def matrix_entropy(eigs: np.ndarray, P: int, *, epsilon: float = 0.0) -> tuple[float, Optional[str]]:
    """Normalised spectral entropy −Σ pᵢ ln pᵢ / ln(rank), pᵢ = eᵢ/Σe, as ``(entropy, None)`` or ``(nan, reason)``.

    P is the larger side (for the rank tolerance); ``epsilon`` (WeightWatcher's regulariser) is added to every pᵢ and to
    the rank."""
    e = np.asarray(eigs, dtype=np.float64)
    total = float(np.sum(e))
    rank = matrix_rank(e, P)
    if not total > 0.0:
        return math.nan, "all-zero spectrum"
    if rank <= 1:
        return math.nan, f"matrix rank {rank}: entropy normalised by ln(rank) is undefined"
    p = e / total + epsilon
    if epsilon == 0.0:
        p = p[p > 0.0]  # 0·ln 0 = 0
    return float(-np.sum(p * np.log(p)) / np.log(rank + epsilon)), None


def _compute(spec: Spectrum, options: MetricOptions) -> GroupResult:
    return _compute_many([spec], options)[0]


def _compute_many(specs: Sequence[Spectrum], options: MetricOptions) -> list[GroupResult]:
    """``_compute`` of each spectrum, the Marchenko–Pastur fits of one shape as one batch (``mp_fit_many``)."""
    results = [GroupResult() for _ in specs]
    usable: list[tuple[int, np.ndarray]] = []
    for k, spec in enumerate(specs):
        e = np.sort(np.asarray(spec.eigs, dtype=np.float64))
        problem = spectrum_problem(e)
        if problem is None:
            _norm_columns(results[k], e, spec, options)
            usable.append((k, e))
        else:
            results[k].fail_all(COLUMNS, problem)
    _power_law_columns(results, specs, usable, options)
    by_shape: dict[tuple[int, int], list[tuple[int, np.ndarray]]] = {}
    for k, e in usable:
        by_shape.setdefault((specs[k].P, specs[k].p), []).append((k, e))
    for (P, p), members in by_shape.items():  # noqa: N806 - WeightWatcher's N, M
        for (k, _), fit in zip(members, mp_fit_many([e for _, e in members], P, p)):
            if fit.reason is not None:
                results[k].fail_all(("bulk_max", "num_spikes", "mp_softrank"), f"MP fit: {fit.reason}")
                continue
            results[k].put_rescaled("bulk_max", fit.bulk_max, 1.0, specs[k].log_scale)
            results[k].values["num_spikes"], results[k].values["mp_softrank"] = fit.num_spikes, fit.mp_softrank
    return results


def spectrum_problem(e: np.ndarray) -> Optional[str]:
    if e.size == 0:
        return "empty spectrum"
    if not np.all(np.isfinite(e)):
        return "non-finite eigenvalue"
    if e[0] < 0.0:
        return f"negative eigenvalue {float(e[0])!r} (the spectrum stage should clip noise to 0)"
    if not e[-1] > 0.0:
        return "all-zero spectrum"
    return None


def _norm_columns(result: GroupResult, e: np.ndarray, spec: Spectrum, options: MetricOptions) -> None:
    norm = float(np.sum(e))
    spectral = float(e[-1])
    shift = spec.log_scale / _LN10  # log10 of the true eigenvalues over the stored ones
    for column, value in (("norm", norm), ("spectral_norm", spectral)):
        result.put_rescaled(column, value, 1.0, spec.log_scale)
        result.values[f"log_{column}"] = math.log10(value) + shift
    result.values["stable_rank"] = norm / spectral
    result.values["matrix_rank"] = matrix_rank(e, spec.P)
    entropy, reason = matrix_entropy(e, spec.P, epsilon=options.conventions.entropy_epsilon)
    if reason is None:
        result.values["entropy"] = entropy
    else:
        result.fail("entropy", reason)
    # rank_loss, weak_rank_loss, sv_min, lambda_max; per slice under ``slice_svd`` (docs/metrics.md)
    result.put_rescaled("lambda_max", spectral, 1.0, spec.log_scale)
    result.values["weak_rank_loss"] = int(np.count_nonzero(e < stored_threshold(WW_WEAK_RANK_TOL, spec.log_scale)))
    per_slice = spec.extra.get("htsr")
    if per_slice is None:
        result.values["rank_loss"] = int(e.size) - matrix_rank(e, spec.P)
        result.put_rescaled("sv_min", math.sqrt(float(e[0])), 0.5, spec.log_scale)
        return
    # WeightWatcher's per-slice definitions (its combined_eigenvalues); sv are of the stored slices.
    result.values["rank_loss"] = sum(int(sv.size) - _rank(sv, spec.P) for sv in per_slice)
    result.put_rescaled("sv_min", max(float(np.min(sv)) for sv in per_slice), 0.5, spec.log_scale)


def slice_singular_values(matrices: Sequence[Any], device: Any, options: MetricOptions, name: str) -> Optional[list[np.ndarray]]:
    """The ``from_matrices`` hook: each pooled slice's float64 LAPACK singular values, as WeightWatcher computes them
    for its per-slice ``rank_loss`` and ``sv_min``; None without ``slice_svd`` or for a single matrix."""
    if not options.conventions.slice_svd or len(matrices) < 2:
        return None
    from scipy.linalg import svd

    return [svd(to_numpy(m).astype(np.float64), compute_uv=False) for m in matrices]


def fit_spectrum_power_law(spec: Spectrum, options: MetricOptions) -> PowerLawFit:
    """The fit behind the ``alpha`` and ``xmin`` columns of one spectrum, as this group makes it (``xmin`` in the
    stored units of ``spec.eigs``, see ``Spectrum.log_scale``); a failure (NaN + reason) for an unusable spectrum."""
    e = np.sort(np.asarray(spec.eigs if spec.eigs is not None else [], dtype=np.float64))
    problem = spectrum_problem(e)
    if problem is not None:
        return failed_fit(options.conventions.power_law, problem)
    return _tail_fit(e[e > stored_threshold(options.conventions.evals_thresh, spec.log_scale)], options)


_PL_COLUMNS = ("alpha", "sigma", "xmin", "num_pl_spikes", "alpha_weighted", "log_alpha_norm")


def _power_law_columns(results: list[GroupResult], specs: Sequence[Spectrum], usable: list[tuple[int, np.ndarray]],
                       options: MetricOptions) -> None:
    """The power-law and truncated power-law columns of each usable spectrum ``(k, sorted e)``."""
    threshold = options.conventions.evals_thresh
    fitted = []
    for k, e in usable:
        tail_source = e[e > stored_threshold(threshold, specs[k].log_scale)]
        fit = _tail_fit(tail_source, options)
        result = results[k]
        if fit.reason is not None:
            dropped = e.size - tail_source.size
            note = f" ({dropped} eigenvalue(s) <= {threshold:g} dropped)" if dropped else ""
            result.fail_all(_PL_COLUMNS + ("tpl_alpha", "tpl_lambda"), f"power-law fit: {fit.reason}{note}")
            continue
        shift = specs[k].log_scale / _LN10
        top = float(e[-1])
        result.values["alpha"] = fit.alpha
        if math.isnan(fit.sigma):
            result.fail("sigma", "no standard error for a truncated power-law fit (fit=tpl/e_tpl)")
        else:
            result.values["sigma"] = fit.sigma
        result.put_rescaled("xmin", fit.xmin, 1.0, specs[k].log_scale)
        result.values["num_pl_spikes"] = int(np.count_nonzero(e >= fit.xmin))
        result.values["alpha_weighted"] = fit.alpha * (math.log10(top) + shift)
        # log10 Σ e^α = α·log10 max e + log10 Σ (e/max e)^α: e^α alone underflows to 0 for tiny
        # weights (randn·1e-30: e ~ 1e-58, α ~ 5) and overflows for huge ones.
        with np.errstate(over="ignore", divide="ignore"):  # a truncated fit's α may be negative
            total = float(np.sum((e / top) ** fit.alpha))
        if math.isfinite(total):
            result.values["log_alpha_norm"] = fit.alpha * (math.log10(top) + shift) + math.log10(total)
        else:
            result.fail("log_alpha_norm", f"sum of (e/max e)^alpha overflows float64 at alpha = {fit.alpha:.6g}")
        fitted.append((k, tail_source, fit.xmin))
    for k, tail, xmin in fitted:
        tpl = fit_truncated_power_law(tail, xmin=xmin)
        if tpl.reason is None:
            results[k].values["tpl_alpha"] = tpl.alpha
            results[k].put_rescaled("tpl_lambda", tpl.lam, -1.0, specs[k].log_scale)
        else:
            results[k].fail_all(("tpl_alpha", "tpl_lambda"), f"truncated power-law fit: {tpl.reason}")


def _tail_fit(tail: np.ndarray, options: MetricOptions) -> PowerLawFit:
    """The power-law fit of the thresholded ``tail``, or the ``fix_fingers`` / ``fit`` one
    (:func:`wbfe.metrics.fingers.fit_tail`) in its shape (its α the truncated fit's for ``fit=tpl``)."""
    if options.fix_fingers is None and options.fit == "pl":
        return fit_power_law(tail, min_tail=options.min_tail, method=options.conventions.power_law)
    from wbfe.metrics.fingers import fit_tail

    t = fit_tail(tail, fix_fingers=options.fix_fingers, fit=options.fit, min_tail=options.min_tail,
                 conventions=options.conventions)
    if t.reason is not None or not math.isfinite(t.alpha):
        return failed_fit("fingers", t.reason or f"alpha = {t.alpha}")
    return PowerLawFit(t.alpha, t.sigma, t.xmin, float(tail[-1]), int(np.count_nonzero(tail >= t.xmin)), t.ks, 0,
                       "fingers")


GROUP = MetricGroup(
    name="htsr",
    columns=COLUMNS,
    summary_columns=(
        "alpha", "alpha_weighted", "log_norm", "log_spectral_norm", "stable_rank", "log_alpha_norm", "entropy",
    ),
    compute=_compute,
    compute_many=_compute_many,
    from_matrices=slice_singular_values,
    # The fits need --min-eigs eigenvalues; the norms, ranks and entropy are computed for any matrix,
    # as WeightWatcher computes them.
    tail_columns=_PL_COLUMNS + ("tpl_alpha", "tpl_lambda", "bulk_max", "num_spikes", "mp_softrank"),
    description="HT-SR baselines (WeightWatcher 0.7.7 metrics): norms, ranks, entropy, alpha, MP fit",
)
