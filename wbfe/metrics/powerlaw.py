"""Power-law and truncated power-law fits of an eigenvalue tail (docs/math.md §4).

``method="ww"`` is WeightWatcher 0.7.7's ``WWFit`` (``weightwatcher/WW_powerlaw.py``); docs/math.md §4 lists where it
differs. The truncated power law's normaliser is a quadrature in log space: valid for any real α when Λ > 0."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable, Literal, Optional

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.options.constraints import Choice, Integer

__all__ = [
    "PowerLawFit", "TruncatedPowerLawFit", "fit_power_law", "fit_truncated_power_law", "fit_power_law_in_range",
    "tpl_log_normaliser", "WW_SMALL_N",
]

#: Below this many values WeightWatcher 0.7.7 switches to its small-N estimator.
WW_SMALL_N = 20
_WW_SMALL_N_MIN_TAIL = 8
# Candidates × tail values evaluated at once; bounds the memory of the vectorised KS scan.
_BLOCK_ELEMENTS = 1 << 20
_TPL_MAX_NEWTON = 100
_MIN_TAIL = Integer(2, words="at least 2")
_METHOD = Choice(("csn", "ww"))
_GL_X, _GL_W = np.polynomial.legendre.leggauss(20)  # nodes and weights of each panel of the TPL normaliser
_TPL_DROP = 60.0  # integrand ignored below e^-60 of its peak


class FitOutcome:
    """What every fit's result has: ``reason`` says why it failed."""

    reason: Optional[str]

    @property
    def ok(self) -> bool:
        """True when the fit succeeded."""
        return self.reason is None


@dataclass(frozen=True)
class PowerLawFit(FitOutcome):
    """Result of a continuous power-law fit: NaN numbers and a ``reason`` on failure.

    ``n_candidates`` counts the eligible xmin; ``method`` is ``"csn"``, ``"ww"``, ``"ww-small-n"`` or ``"range"``."""

    alpha: float
    sigma: float
    xmin: float
    xmax: float
    n_tail: int
    ks: float
    n_candidates: int
    method: str
    reason: Optional[str] = None


@dataclass(frozen=True)
class TruncatedPowerLawFit(FitOutcome):
    """Result of a truncated power-law MLE on x ≥ xmin; ``reason`` says why it failed.

    α is any real (α < 1 is normalisable because Λ > 0); Λ is exactly 0 when no truncation raises the likelihood (the
    maximum is then the plain power law)."""

    alpha: float
    lam: float
    xmin: float
    n_tail: int
    loglik: float
    reason: Optional[str] = None

    @classmethod
    def failed(cls, reason: str, xmin: float = math.nan, n_tail: int = 0) -> TruncatedPowerLawFit:
        """The failed fit: NaN α, Λ and log-likelihood, with the ``xmin`` and tail size it was tried on."""
        return cls(math.nan, math.nan, xmin, n_tail, math.nan, reason)


def failed_fit(method: str, reason: str, n_candidates: int = 0) -> PowerLawFit:
    return PowerLawFit(math.nan, math.nan, math.nan, math.nan, 0, math.nan, n_candidates, method, reason)


def fit_power_law(
    values: np.ndarray, *, min_tail: int = 10, method: Literal["csn", "ww"] = "csn"
) -> PowerLawFit:
    """Clauset–Shalizi–Newman continuous power-law fit of positive ``values`` with the xmin chosen by KS distance.

    ``min_tail`` (≥ 2) is the smallest tail accepted, except by ``method="ww"`` (WeightWatcher 0.7.7's ``WWFit``
    exactly, ``Conventions.power_law``). On failure every number is NaN and ``reason`` says why.

    Raises:
        InvalidOptionError: ``min_tail`` not an integer >= 2, or an unknown ``method`` (a ``ValueError``).
    """
    min_tail = _MIN_TAIL("min_tail", min_tail)
    _METHOD("method", method)
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size and not np.all(np.isfinite(x)):
        return failed_fit(method, "non-finite values")
    if x.size and x[0] <= 0.0:
        return failed_fit(method, "non-positive values (drop zero eigenvalues first)")
    ww = method == "ww"
    if ww and x.size < 2:
        return failed_fit(method, f"only {x.size} value(s), need at least 2")
    if ww and x.size < WW_SMALL_N:
        return _fit_ww_small_n(x)
    if not ww and x.size < min_tail:
        return failed_fit(method, f"only {x.size} positive value(s), need a tail of at least {min_tail}")
    alphas, n_tail = _tail_alphas(x)
    valid = alphas > 1.0 if ww else np.isfinite(alphas) & (alphas > 1.0) & (n_tail >= min_tail)
    ks = _ks_all(x, alphas, valid) if ww or valid.any() else np.full(alphas.size, np.inf)
    return _pick_xmin(x, alphas, n_tail, valid, ks, min_tail=min_tail, method=method)


def fit_power_law_in_range(values: np.ndarray, lo: float, hi: float, *, min_tail: int = 10) -> PowerLawFit:
    """The power-law fit with ``xmin`` among the sample's values in [lo, hi) (either order), as the ``powerlaw``
    package's ``Fit(data, xmin=(lo, hi))`` restricts it. The candidates are the distinct values in the range less the
    largest of them (the package drops it, meant as the sample's maximum, also from a range); the first minimum of the
    KS distance among those with α > 1 and a tail of at least ``min_tail`` (1 accepts any) wins; NaN + reason when none
    does."""
    method = "range"
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size and (not np.all(np.isfinite(x)) or x[0] <= 0.0):
        return failed_fit(method, "non-finite or non-positive values")
    low, high = min(lo, hi), max(lo, hi)
    candidates = range_candidates(x, low, high)
    if candidates.size == 0:
        return failed_fit(method, f"no candidate xmin in [{low:.6g}, {high:.6g})")
    alphas, n_tail = _tail_alphas(x)
    valid = np.zeros(alphas.size, dtype=bool)
    valid[candidates] = np.isfinite(alphas[candidates]) & (alphas[candidates] > 1.0) & (n_tail[candidates] >= min_tail)
    if not valid.any():
        return failed_fit(method, f"no candidate xmin in [{low:.6g}, {high:.6g}) gives alpha > 1 with a tail of "
                          f"{min_tail}", int(candidates.size))
    ks = _ks_all(x, alphas, valid)
    return dataclasses.replace(_pick_xmin(x, alphas, n_tail, valid, ks, min_tail=min_tail, method="csn"), method=method)


def range_candidates(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Indices of the candidate xmin in [lo, hi) of the sorted ``x``, as the ``powerlaw`` package takes them: the first
    of each distinct value (as np.unique(return_index)), less the largest in the range and the sample's last."""
    first = np.ones(x.size, dtype=bool)
    first[1:] = x[1:] != x[:-1]
    candidates = np.flatnonzero((x >= lo) & (x < hi) & first)[:-1]
    return candidates[candidates < x.size - 1]


def _tail_alphas(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """α and n_tail for every candidate xmin = x[i], i < n − 1 (x sorted ascending along its last
    axis; a 2-D x is a stack of samples, each row's α the same numbers as alone)."""
    n = x.shape[-1]
    logx = np.log(x)
    # Suffix sums of log x, shifted by log x[0] to keep the cancellation in S_i − n_i·log x_i small.
    shifted = logx - logx[..., :1]
    suffix = np.cumsum(shifted[..., ::-1], axis=-1)[..., ::-1]
    n_tail = (n - np.arange(n - 1)).astype(np.float64)
    denom = suffix[..., :-1] - n_tail * shifted[..., :-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        alphas = 1.0 + n_tail / denom
    return alphas, n_tail


def _ks_rows(x: np.ndarray, rows: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """KS distances of the candidates ``rows`` (ascending), each against its own tail (vectorised)."""
    cols = np.arange(int(rows[0]), x.size)
    k = cols[None, :] - rows[:, None]  # rank within each tail
    n_tail = (x.size - rows).astype(np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # Same operations as WeightWatcher (ratio ** (1 − α)) so its choices are reproduced bit for bit.
        theo = 1.0 - (x[cols][None, :] / x[rows, None]) ** (-alphas[rows, None] + 1.0)
        diff = np.abs(theo - k / n_tail)
    diff[k < 0] = -np.inf
    return np.max(diff, axis=1)


def _ks_all(x: np.ndarray, alphas: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """KS distances of the eligible candidates, in blocks of about _BLOCK_ELEMENTS; +inf for the others."""
    ks = np.full(x.size - 1, np.inf)
    idx = np.flatnonzero(eligible)
    step = max(1, _BLOCK_ELEMENTS // x.size)
    for i in range(0, idx.size, step):
        ks[idx[i : i + step]] = _ks_rows(x, idx[i : i + step], alphas)
    return ks


def _pick_xmin(
    x: np.ndarray, alphas: np.ndarray, n_tail: np.ndarray, valid: np.ndarray, ks: np.ndarray, *, min_tail: int, method: str
) -> PowerLawFit:
    """The fit at the first minimum of the KS distances ``ks`` of the ``valid`` candidates."""
    if method == "ww":
        # WWFit: D stays 1 where α <= 1, so such candidates still compete (and win if nothing else).
        ks = np.where(valid, ks, 1.0)
        n_eligible = int(ks.size)
    else:
        n_eligible = int(np.count_nonzero(valid))
        if n_eligible == 0:
            reason = f"degenerate spectrum: no tail of at least {min_tail} values gives a finite alpha > 1"
            return failed_fit(method, reason)
    i = int(np.argmin(ks))  # first minimum, as WeightWatcher
    alpha = float(alphas[i])
    if not (math.isfinite(alpha) and alpha > 1.0):
        return failed_fit(method, f"degenerate tail: alpha = {alpha} at the best xmin", n_eligible)
    nt = int(n_tail[i])
    return PowerLawFit(alpha, (alpha - 1.0) / math.sqrt(nt), float(x[i]), float(x[-1]), nt, float(ks[i]), n_eligible,
                       method)


def _fit_ww_small_n(x: np.ndarray) -> PowerLawFit:
    """WeightWatcher 0.7.7 ``WWFit`` for n < 20 values, as it really behaves (docs/math.md §4)."""
    method = "ww-small-n"
    n = x.size
    logx = np.log(x)
    alphas = np.zeros(n - 1)
    ds = np.ones(n - 1)

    def candidate(i: int) -> bool:
        """α of the tail from x[i]; False where it is constant (α > 1 otherwise: n < 20)."""
        nt = n - i
        s = float(np.sum(logx[i:]) - nt * logx[i])
        if s <= 1e-12:
            return False
        alphas[i] = 1.0 + (nt - 1.0) / s
        return True

    kept = [i for i in range(n - _WW_SMALL_N_MIN_TAIL + 1) if candidate(i)]  # n < 20: WW's sums, one by one
    # WeightWatcher's fallback: the whole sample as the tail (it reports α = 0 if that is constant).
    if not kept and not candidate(0):
        return failed_fit(method, "degenerate spectrum: all values equal")
    rows = np.array(kept or [0])
    ds[rows] = _ks_rows(x, rows, alphas)  # the block scan's KS distances
    # A kept candidate (its distance < 1, the others' 1), whose α = 1 + (nt − 1)/s, 1e-12 < s < nt·1455: finite, > 1.
    i = int(np.argmin(ds))
    alpha = float(alphas[i])
    nt = n - i
    return PowerLawFit(
        alpha=alpha, sigma=(alpha - 1.0) / math.sqrt(nt), xmin=float(x[i]), xmax=float(x[-1]), n_tail=nt,
        ks=float(ds[i]), n_candidates=max(0, n - _WW_SMALL_N_MIN_TAIL + 1), method=method,
    )


def _panel_edges(peak: float, scale: float, lower: float, s: float, c: float, h_peak: float) -> list[float]:
    """Edges going away from ``peak`` (to ``lower`` if it is below the peak, else to +∞): widths
    scale/2, scale, 2·scale, … capped at 1, until h(u) = s·u − c·(e^u − 1) is more than
    ``_TPL_DROP`` below ``h_peak`` or ``lower`` is reached."""
    edges = [peak]
    sign = -1.0 if lower < peak else 1.0
    width = min(0.5 * scale, 1.0)
    while True:
        edge = edges[-1] + sign * width
        if sign < 0.0 and edge <= lower:
            return edges + [lower]
        edges.append(edge)
        if s * edge - c * math.expm1(edge) - h_peak < -_TPL_DROP:
            return edges
        width = min(2.0 * width, 1.0)


def _tpl_panels(alpha: float, c: float) -> tuple[list[float], float]:
    """Panel edges for ∫_0^∞ exp(h(u)) du, h(u) = (1−α)u − c(e^u − 1) (c = Λ), and h at its peak."""
    s = 1.0 - alpha
    if s > c:  # interior peak at e^u = s/c, curvature −s there
        u_peak = math.log(s / c)
        scale = 1.0 / math.sqrt(s)
    else:  # peak at u = 0: decay rate c − s, curvature c
        u_peak = 0.0
        scale = min(1.0 / (c - s) if c > s else math.inf, 1.0 / math.sqrt(c), 1.0)
    h_peak = s * u_peak - c * math.expm1(u_peak)
    edges = _panel_edges(u_peak, scale, math.inf, s, c, h_peak)
    if u_peak > 0.0:
        edges = _panel_edges(u_peak, scale, 0.0, s, c, h_peak)[::-1] + edges[1:]
    return edges, h_peak


def _tpl_quadrature(alpha: float, lam: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Composite Gauss–Legendre nodes u and weights w (a row per panel) of ∫_0^∞ exp(h(u)) du (the TPL on
    y = e^u ≥ 1), and h_peak: the weights include exp(h − h_peak), so ∫ exp(h) = e^h_peak · Σw."""
    edges, h_peak = _tpl_panels(alpha, lam)
    e = np.array(edges)[:, None]
    lo, hi = e[:-1], e[1:]
    half = 0.5 * (hi - lo)
    u = 0.5 * (lo + hi) + half * _GL_X
    w = (half * _GL_W) * np.exp((1.0 - alpha) * u - lam * np.expm1(u) - h_peak)
    return u, w, h_peak


def tpl_log_normaliser(alpha: float, lam: float, xmin: float) -> float:
    """log Z, Z = ∫_xmin^∞ x^(−α)·exp(−Λx) dx = Λ^(α−1)·Γ(1−α, Λ·xmin), for any real α, Λ > 0, xmin > 0.

    By quadrature in u = log(x/xmin), where the integrand is log-concave (:func:`_tpl_quadrature`). Raises
    InvalidOptionError (a ValueError) when ``alpha`` is not finite or ``lam``, ``xmin`` not positive and finite (an
    infinite Λ looped forever)."""
    if not (math.isfinite(alpha) and 0.0 < lam < math.inf and 0.0 < xmin < math.inf):
        raise InvalidOptionError(f"need a finite alpha and finite lam > 0, xmin > 0, not alpha={alpha!r}, lam={lam!r}, "
                                 f"xmin={xmin!r}")
    c = lam * xmin
    _, w, h_peak = _tpl_quadrature(alpha, c)
    return (1.0 - alpha) * math.log(xmin) - c + h_peak + math.log(float(np.sum(w)))


# (value, gradient (2), Hessian entries (0,0), (0,1), (1,1)) of the objective of one fit.
_Eval = tuple[float, float, float, float, float, float]


def _tpl_objective(alpha: float, lam: float, mean_u: float, mean_y: float) -> _Eval:
    """Mean negative log-likelihood of the TPL on y ≥ 1 at (``alpha``, ``lam``) with its gradient and Hessian in (α, Λ),
    on data with means ``mean_u`` of log y and ``mean_y`` of y. An exponential family in (−α, −Λ) with statistics (log
    y, y): the gradient is the data's mean statistics minus the model's, the Hessian the model's covariance of (log y,
    y)."""
    u, w, h_peak = _tpl_quadrature(alpha, lam)

    def total(a: np.ndarray) -> float:  # (panels, nodes) -> sum of the row sums in row order
        return float(np.cumsum(a.sum(axis=-1))[-1])

    total_w = total(w)
    p = w / total_w
    y = np.exp(u)
    eu = total(p * u)
    ey = total(p * y)
    du = u - eu
    dy = y - ey
    h_uu = total(p * (du * du))
    h_uy = total(p * (du * dy))
    h_yy = total(p * (dy * dy))
    log_w = math.log(total_w) if total_w > 0.0 else (-math.inf if total_w == 0.0 else math.nan)
    return alpha * mean_u + lam * mean_y - lam + h_peak + log_w, mean_u - eu, mean_y - ey, h_uu, h_uy, h_yy


# Damping factors of the Levenberg–Marquardt shift, in order; beyond the last, the identity.
_DAMPINGS = [10.0**k for k in range(-3, 12)]


def _ldl(h00: float, h01: float, h11: float) -> Optional[tuple[float, float]]:
    """β = h01/h00 and the Schur complement h11 − β·h01 of [[h00, h01], [h01, h11]] = L·D·Lᵀ, or
    None when the matrix is not (numerically) positive definite."""
    beta = h01 / h00 if h00 != 0.0 else math.nan
    schur = h11 - beta * h01
    if math.isfinite(h00) and math.isfinite(h01) and math.isfinite(h11) and h00 > 0.0 and schur > 0.0:
        return beta, schur
    return None


def _newton_step(g0: float, g1: float, h00: float, h01: float, h11: float) -> tuple[float, float]:
    """−H⁻¹g by LDLᵀ (backward stable for a positive definite H), H's diagonal raised until it is one."""
    s00 = h00
    factors = _ldl(h00, h01, h11)
    for damping in _DAMPINGS if factors is None else ():
        s00 = h00 + damping * (abs(h00) + 1e-300)
        factors = _ldl(s00, h01, h11 + damping * (abs(h11) + 1e-300))
        if factors is not None:
            break
    if factors is None:
        s00, factors = 1.0, (0.0, 1.0)
    beta, schur = factors
    step1 = (beta * g0 - g1) / schur
    return -g0 / s00 - beta * step1, step1


def _max_step(x1: float, step1: float, log_lam: bool) -> float:
    if log_lam:  # log Λ moves by at most 5 per step
        return min(1.0, 5.0 / max(abs(step1), 1e-300))
    return 1.0 if step1 >= 0.0 else min(1.0, 0.9 * x1 / -step1)  # at most 90 % of the way to Λ = 0


def _damped_newton(
    objective: Callable[[float, float], _Eval], x0: float, x1: float, log_lam: bool
) -> tuple[float, float, float, bool]:
    """Minimise ``objective(α, Λ)`` by Newton steps with backtracking, over (α, Λ) or (α, log Λ). Where the Hessian is
    not positive definite its diagonal is raised (Levenberg–Marquardt); :func:`_max_step` bounds the step length (to
    stay in the domain). Returns (x0, x1, value, converged)."""

    def evaluate(x0: float, x1: float) -> _Eval:
        if not log_lam:
            return objective(x0, x1)
        lam = math.exp(x1)
        value, g0, g1, h00, h01, h11 = objective(x0, lam)
        return value, g0, lam * g1, h00, lam * h01, lam * lam * h11 + lam * g1

    value, g0, g1, h00, h01, h11 = evaluate(x0, x1)
    for _ in range(_TPL_MAX_NEWTON):
        s0, s1 = _newton_step(g0, g1, h00, h01, h11)
        decrement = -(g0 * s0 + g1 * s1)
        scale = max(1.0, abs(value))
        # The decrement is about twice the distance to the minimum: below rounding of it, stop.
        if decrement < 1e-14 * scale:
            return x0, x1, value, True
        t = _max_step(x1, s1, log_lam)
        while t > 1e-12:
            new_x0, new_x1 = x0 + t * s0, x1 + t * s1
            new = evaluate(new_x0, new_x1)
            if new[0] <= value - 1e-4 * t * decrement:
                break
            t *= 0.5
        else:  # no decrease left to find: converged if the decrement was already small
            return x0, x1, value, decrement < 1e-10 * scale
        x0, x1 = new_x0, new_x1
        value, g0, g1, h00, h01, h11 = new
    return x0, x1, value, False


def fit_truncated_power_law(
    values: np.ndarray, *, xmin: Optional[float] = None
) -> TruncatedPowerLawFit:
    """Maximum-likelihood (α, Λ) of p(x) ∝ x^(−α)·exp(−Λx) on the values x ≥ xmin (default the smallest).

    NaN + reason when the values are not finite, the tail is too small or degenerate, or Λ leaves float64's range;
    InvalidOptionError when ``xmin`` is not positive and finite. The NLL is convex in (α, Λ), so Newton there converges
    from anywhere, except that an optimum at very small Λ sits where the curvature in Λ blows up (Var y ~ Λ^(α−3)) and
    the steps stall against Λ = 0; from where they stall, Newton in (α, log Λ), where the NLL is smooth, finishes."""
    if xmin is not None and not 0.0 < xmin < math.inf:
        raise InvalidOptionError(f"xmin must be a positive number, not {xmin!r}")
    x = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):  # once dropped, and the rest fitted as if they were the sample
        return TruncatedPowerLawFit.failed("non-finite values")
    x = x[x > 0.0]
    if x.size == 0:
        return TruncatedPowerLawFit.failed("no positive values")
    lo = float(np.min(x)) if xmin is None else float(xmin)
    tail = x[x >= lo]
    n = tail.size
    if n < 3:
        return TruncatedPowerLawFit.failed(f"only {n} value(s) >= xmin, need 3", lo, n)
    # Work in y = x/xmin ≥ 1 so Λ' = Λ·xmin is O(1) whatever the scale of the spectrum.
    y = tail / lo
    mean_log = float(np.mean(np.log(y)))
    mean_y = float(np.mean(y))
    if mean_log <= 1e-14 * max(1.0, mean_y):
        return TruncatedPowerLawFit.failed("degenerate tail: all values equal xmin", lo, n)
    alpha_pl = 1.0 + 1.0 / mean_log
    # The untruncated power law is the boundary Λ = 0 of a convex problem: it is the MLE when the
    # likelihood cannot rise by truncating, i.e. when the data's mean is at least the power law's.
    if alpha_pl > 2.0 and mean_y >= (alpha_pl - 1.0) / (alpha_pl - 2.0):
        nll = alpha_pl * mean_log - math.log(alpha_pl - 1.0)
        return TruncatedPowerLawFit(alpha_pl, 0.0, lo, n, float(-n * (nll + math.log(lo))))
    objective = functools.partial(_tpl_objective, mean_u=mean_log, mean_y=mean_y)
    a_hat, lam_scaled, nll, converged = _damped_newton(objective, alpha_pl, 0.1 / mean_y, False)
    if not converged and lam_scaled > 0.0:
        a_hat, log_lam, nll, converged = _damped_newton(objective, a_hat, math.log(lam_scaled), True)
        lam_scaled = math.exp(log_lam)
    if not (converged and math.isfinite(a_hat) and math.isfinite(nll) and lam_scaled > 0.0):
        return TruncatedPowerLawFit.failed("likelihood maximisation did not converge", lo, n)
    if not lam_scaled / lo < math.inf:  # a subnormal xmin
        return TruncatedPowerLawFit.failed(f"lambda = {lam_scaled:.6g}/xmin overflows", lo, n)
    loglik = float(-n * (nll + math.log(lo)))  # density in x carries a 1/xmin Jacobian
    return TruncatedPowerLawFit(a_hat, lam_scaled / lo, lo, n, loglik)
