"""BFE-W: the Bayesian free energy of a weight matrix (docs/math.md §2).

F* is computed as ½·log(2πe) + ½·(log mean(e) − mean(log e)), with no cancellation. The primal (out <= in) and dual (out
> in) forms are the same expression on the smaller Gram matrix."""

from __future__ import annotations

import math
from typing import Literal, Union

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.linalg.spectra import Spectrum
from wbfe.metrics._group import GroupResult, MetricGroup, MetricOptions, check_gamma, out_of_range, rescaled
from wbfe.options import parse_lambda, positive_lambda

__all__ = ["bfe", "bfe_from_moments", "lambda_star", "bfe_marchenko_pastur_limit", "GROUP"]

LOG_2PI_E = math.log(2.0 * math.pi) + 1.0

def lambda_star(eigs: np.ndarray) -> float:
    """Optimal prior precision λ* = n / Tr(WᵀW) = 1 / mean(e); InvalidOptionError unless 0 < mean(e) < ∞."""
    mean_e = float(np.mean(eigs)) if np.size(eigs) else 0.0
    if not (0.0 < mean_e < math.inf and 1.0 / mean_e < math.inf):
        raise InvalidOptionError(f"lambda* = 1/mean(e) needs a positive, finite mean eigenvalue with a finite "
                                 f"inverse, not {mean_e!r}")
    return 1.0 / mean_e


def bfe(eigs: np.ndarray, lam: Union[Literal["opt"], float] = "opt") -> tuple[float, float]:
    """BFE-W of a spectrum at ``lam`` (``"opt"``: λ* = 1/mean(e)) as ``(F, λ used)``; F = +inf when an e is 0.

    Raises:
        InvalidOptionError: ``lam`` is neither ``"opt"`` nor a positive finite number, or the
            spectrum is empty, all zero, or has a NaN, infinite or negative eigenvalue.
    """
    e = np.asarray(eigs, dtype=np.float64)
    if e.size == 0:
        raise InvalidOptionError("BFE-W needs at least one eigenvalue")
    if not (np.all(np.isfinite(e)) and float(np.min(e)) >= 0.0):  # a negative one read as a zero: +inf
        raise InvalidOptionError("BFE-W needs finite, non-negative eigenvalues (a Gram matrix's)")
    # log det = −inf when an eigenvalue is 0: F is +inf at every λ; reported, not hidden by jitter.
    mean_log = float(np.mean(np.log(e))) if np.all(e > 0.0) else -math.inf
    return bfe_from_moments(float(np.mean(e)), mean_log, lam)


def bfe_from_moments(
    mean_e: float, mean_log_e: float, lam: Union[Literal["opt"], float] = "opt"
) -> tuple[float, float]:
    """BFE-W from mean(e) and mean(log e) alone (all the formula needs); see :func:`bfe`."""
    if not (math.isfinite(mean_e) and mean_log_e < math.inf):  # NaN included
        raise InvalidOptionError(f"BFE-W needs a finite mean(e) and mean(log e) < inf, not {mean_e!r}, {mean_log_e!r}")
    if not mean_e > 0.0:
        raise InvalidOptionError("BFE-W is undefined for an all-zero matrix")
    lam_used = parse_lambda(lam)
    if lam_used == "opt":
        return 0.5 * LOG_2PI_E + 0.5 * (math.log(mean_e) - mean_log_e), 1.0 / mean_e
    return bfe_at_fixed_lambda(mean_e, mean_log_e, lam_used), lam_used


def bfe_at_fixed_lambda(mean_e: float, mean_log_e: float, lam: float) -> float:
    """BFE-W's formula at a given λ, unchecked (its callers have checked the moments)."""
    return 0.5 * lam * mean_e - 0.5 * mean_log_e + 0.5 * math.log(2.0 * math.pi / lam)


def bfe_marchenko_pastur_limit(gamma: float) -> float:
    """Limit of F* for an i.i.d. Gaussian matrix of aspect ratio γ ∈ (0, 1) as p → ∞."""
    check_gamma(gamma)
    return 0.5 * LOG_2PI_E + 0.5 * (1.0 + (1.0 - gamma) / gamma * math.log1p(-gamma))


def _compute(spec: Spectrum, options: MetricOptions) -> GroupResult:
    result = GroupResult()
    mean_e, mean_log_e, _, n_zero = spec.log_moments()
    if not mean_e > 0.0:  # an intra product can be all zero (a matrix is skipped as one before it gets here)
        result.fail_all(("lambda", "bfe"), "all-zero spectrum: BFE-W is undefined")
        return result
    if options.lam != "opt" and spec.log_scale:
        # F(λ) of e equals F(λ·s) of e/s: the moments are of the rescaled eigenvalues e/s, and λ·s may lie
        # outside the range a caller's λ is held to.
        lam_used = rescaled(positive_lambda(options.lam), 1.0, spec.log_scale)
        if math.isnan(lam_used):
            result.fail_all(("lambda", "bfe"), out_of_range(spec.log_scale))
            return result
        value = bfe_at_fixed_lambda(mean_e, mean_log_e, lam_used)
    else:
        value, lam_used = bfe_from_moments(mean_e, mean_log_e, options.lam)
    result.values["bfe"] = value
    if options.lam == "opt":
        result.put_rescaled("lambda", lam_used, -1.0, spec.log_scale)
    else:
        result.values["lambda"] = positive_lambda(options.lam)
    if math.isinf(value):
        result.reasons["bfe"] = (
            f"rank-deficient: {n_zero} zero eigenvalue(s), BFE-W = +inf" if n_zero > 0
            else f"BFE-W overflows at lambda = {lam_used:.3g} (lambda/2 * mean eigenvalue = {0.5 * lam_used * mean_e:.3g})"
        )
    return result


GROUP = MetricGroup(
    name="bfe", columns=("lambda", "bfe"), summary_columns=("bfe",), compute=_compute,
    description="BFE-W (primal/dual) at lambda* or a given lambda", needs_eigenvalues=False,
)
