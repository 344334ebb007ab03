"""The Bayes-optimal extensive-width teacher–student fixed point ε = F(ε) (docs/math.md §6).

F jumps wherever some snrᵢ crosses λ_σ, so F(ε) − ε can change sign more than once: every sign change
is bracketed by a scan and refined by bisection, and the smallest root is ε^BO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from wbfe.errors import unknown_name
from wbfe.theory.hermite import Activation, Kernel, kernel
from wbfe.theory.json_io import fields_dict
from wbfe.theory.checks import finite_number, is_number, is_whole, refuse_unless

__all__ = ["READOUTS", "readout", "fixed_point_map", "FixedPoint", "solve", "Sweep", "sweep", "fit_slope", "RegimeFit",
           "fit_regimes", "ScalingRow", "scaling_table"]

READOUTS: tuple[str, ...] = ("power", "dense", "exp", "sparse")
MAX_K = 10**8  # a readout of 800 MB; the solver holds a few arrays of its size
ActivationLike = Union[str, Activation, Callable[[np.ndarray], np.ndarray]]


def check_readout(kind: str, k: int, *, beta: float = 0.3, rate: float = 0.2, nonzeros: int = 3) -> None:
    """What :func:`readout` refuses, checked without building v (the settings check a run's before any work)."""
    if kind not in READOUTS:
        raise unknown_name("readout", kind, list(READOUTS))
    refuse_unless(is_whole(k) and k >= 1, f"k must be an integer >= 1, got {k!r}")
    refuse_unless(k <= MAX_K, f"k must be at most {MAX_K:,} (the readout is held in memory), got {k}")
    refuse_unless(kind != "power" or (is_number(beta) and beta >= 0), f"beta must be a number >= 0, got {beta!r}")
    refuse_unless(kind != "exp" or (finite_number(rate) and rate > 0), f"rate must be > 0 and finite, got {rate!r}")
    refuse_unless(kind != "sparse" or (is_whole(nonzeros) and 1 <= nonzeros <= k),
                  f"nonzeros must be in [1, k={k}], got {nonzeros!r}")


def readout(kind: str, k: int, *, beta: float = 0.3, rate: float = 0.2, nonzeros: int = 3) -> np.ndarray:
    """The teacher's readout v (‖v‖ = 1, float64, length k), sorted by decreasing magnitude.

    ``kind`` is ``power`` (vᵢ ∝ i^(−beta)), ``dense`` (vᵢ = 1/√k), ``exp`` (vᵢ ∝ e^(−rate·i)) or
    ``sparse`` (the first ``nonzeros`` entries equal, the rest 0).

    Raises:
        InvalidOptionError: k < 1 or an option out of range.
        UnknownNameError: an unknown kind.
    """
    check_readout(kind, k, beta=beta, rate=rate, nonzeros=nonzeros)
    i = np.arange(1, int(k) + 1, dtype=np.float64)
    shapes = {"power": lambda: i ** (-beta), "dense": lambda: np.ones(int(k)), "exp": lambda: np.exp(-rate * (i - 1.0)),
              "sparse": lambda: (i <= nonzeros).astype(np.float64)}
    v = shapes[kind]()
    return v / np.linalg.norm(v)


def fixed_point_map(eps: Union[float, np.ndarray], v: np.ndarray, *, n_over_d: float, delta: float,
                    kern: Kernel) -> np.ndarray:
    """F(ε) = Σᵢ vᵢ²·(g(1) − g(m((n/d)·vᵢ²/(Δ + ε)))), vectorised over ε."""
    eps = np.atleast_1d(np.asarray(eps, dtype=np.float64))
    v2 = np.sort(np.asarray(v, dtype=np.float64) ** 2)[::-1]
    a = n_over_d * v2
    # Features with snr < λ_σ contribute vᵢ²·g(1) exactly: sum them as a suffix of the sorted v², and
    # evaluate m only for the (few) features that are on.
    on = np.searchsorted(-a, -kern.lambda_sigma * (delta + eps), side="right")
    suffix = np.append(np.cumsum(v2[::-1])[::-1], 0.0)
    out = kern.g1 * suffix[on]
    # Flatten the (ε, on-feature) pairs, in chunks of rows that keep the flat arrays small.
    bounds = np.searchsorted(np.cumsum(on), np.arange(0, int(on.sum()), 2_000_000), side="right")
    for lo, hi in zip(bounds, np.append(bounds[1:], eps.size)):
        counts = on[lo:hi]
        total = int(counts.sum())
        rows = np.repeat(np.arange(lo, hi), counts)
        idx = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        with np.errstate(over="ignore"):  # an snr past float64's range is inf, whose deficit is its limit, 0
            deficit = kern.deficit_at(a[idx] / (delta + eps[rows]))
        out[lo:hi] += np.bincount(rows - lo, weights=v2[idx] * deficit, minlength=hi - lo)
    return out


@dataclass(frozen=True)
class FixedPoint:
    """The solution of the fixed point for one teacher and one sample size.

    Attributes:
        eps: ε^BO, the smallest root of F(ε) = ε.
        eps_all: every root found (ascending); roots after the first are further crossings.
        kinds: ``stable`` (F − ε goes from + to −) or ``unstable`` (− to +) for each root.
        jumps: places where F jumps over the diagonal (− to + through a discontinuity: no root).
        k_c: effective width #{i : qᵢ > 0}.
        q, snr: per-feature overlaps and signal-to-noise ratios at ε.
    """

    eps: float
    eps_all: tuple[float, ...]
    kinds: tuple[str, ...]
    jumps: tuple[float, ...]
    k_c: int
    q: np.ndarray
    snr: np.ndarray
    n: float
    d: int
    k: int
    r: float
    delta: float
    lambda_sigma: float
    q_sigma: float
    g1: float
    activation: str
    to_dict = fields_dict  # a JSON-ready dict (arrays as lists)


def _roots(h: Callable[[np.ndarray], np.ndarray], grid: np.ndarray, scale: float) -> tuple[list, list, list]:
    hv = h(grid)
    hv[-1] = min(hv[-1], 0.0)  # F(ε_max) ≤ ε_max exactly; rounding must not hide the all-off root
    pos = hv > 0
    roots, kinds, jumps = [], [], []
    for j in np.nonzero(pos[:-1] != pos[1:])[0]:
        lo, hi, h_lo, h_hi = grid[j], grid[j + 1], hv[j], hv[j + 1]
        # Until lo and hi are adjacent floats: a bracket from 0 (or 1e-16 of ε_max) down to a root near 1e-300 takes
        # ~1000 halvings; 200 stopped at 1e-77 and gave that as the root.
        for _ in range(2200):
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi:
                break
            h_mid = float(h(np.array([mid]))[0])
            if (h_mid > 0) == (h_lo > 0):
                lo, h_lo = mid, h_mid
            else:
                hi, h_hi = mid, h_mid
        where = 0.5 * (lo + hi)
        # A bracket that shrinks to nothing with |h| staying large is a jump of F, not a root.
        if min(abs(h_lo), abs(h_hi)) > 1e-9 * scale and h_lo < 0:
            jumps.append(float(where))
        else:
            roots.append(float(where))
            kinds.append("stable" if h_lo > 0 else "unstable")
    return roots, kinds, jumps


def _lower_bound(h: Callable[[np.ndarray], np.ndarray], e_max: float, iterations: int = 40) -> float:
    """A point below the smallest root where F(ε) − ε > 0: F is non-decreasing and F(0) > 0, so the
    iterates of ε ← F(ε) from 0 climb towards the smallest root without passing it."""
    prev = 0.0
    for _ in range(iterations):
        nxt = prev + float(h(np.array([prev]))[0])
        if not nxt > prev * (1 + 1e-9) or nxt >= e_max or not float(h(np.array([nxt]))[0]) > 0:
            break
        prev = nxt
    return prev


def solve(v: np.ndarray, *, delta: float, d: int, n: Optional[float] = None, r: Optional[float] = None,
          activation: ActivationLike = "tanh2", kern: Optional[Kernel] = None, grid_points: int = 600,
          max_jumps: int = 256) -> FixedPoint:
    """Solve the fixed point ε = F(ε) for a readout v, at n samples or at r = n/(k·d) (exactly one).

    Args:
        kern: a prebuilt :class:`~wbfe.theory.hermite.Kernel` (saves rebuilding it in sweeps;
            ``activation`` is then ignored).
        grid_points: points of the geometric scan of [ε₀, g(1)·‖v‖²], ε₀ ≤ ε^BO from :func:`_lower_bound`.
        max_jumps: how many of the jumps of F just above ε₀ are bracketed on both sides.

    Raises:
        InvalidOptionError: a non-positive Δ, d, n or r, an empty v, or both/neither of n and r.
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    refuse_unless(v.size and np.all(np.isfinite(v)) and 0 < float(v @ v) < math.inf,
                  "the readout v must be a non-empty finite vector, not all zero")
    refuse_unless(is_whole(grid_points) and grid_points >= 2 and is_whole(max_jumps) and max_jumps >= 0,
                  f"need grid_points >= 2 and max_jumps >= 0, got {grid_points!r} and {max_jumps!r}")
    refuse_unless(finite_number(delta) and delta > 0, f"delta must be positive and finite, got {delta!r}")
    kern = kern if kern is not None else kernel(activation)
    k = v.size
    refuse_unless((n is None) != (r is None), "give exactly one of n and r")
    refuse_unless(is_whole(d) and d >= 1, f"d must be an integer >= 1, got {d!r}")
    given: Any = n if r is None else r  # any value a caller passed, checked here
    name = "n" if r is None else "r"
    refuse_unless(finite_number(given) and given > 0, f"{name} must be a positive finite number, got {given!r}")
    n_given = r * k * d if n is None else n  # type: ignore[operator]
    # r·k·d past a float (n_given > 0: every factor was checked positive)
    refuse_unless(math.isfinite(n_given), f"n (or r) must be positive and finite, got n={n_given}")
    n_val = float(n_given)
    n_over_d = n_val / d
    v2 = v**2
    # Where an snr passes float64's range its deficit is 0, not ~1/snr: F falls to 0 below some ε (1e-309 at
    # delta 1e-320), a false crossing, or (every snr inf) no crossing at all
    refuse_unless(math.isfinite(n_over_d * float(v2.max()) / delta), f"n/(d·delta) = {n_over_d:.3g}/{delta:.3g} "
                  "is past a float's range: raise delta or lower n (or r)")
    e_max = kern.g1 * float(v2.sum())

    def h(eps: np.ndarray) -> np.ndarray:
        return fixed_point_map(eps, v, n_over_d=n_over_d, delta=delta, kern=kern) - eps

    start = _lower_bound(h, e_max)
    breaks = np.unique(n_over_d * v2[v2 > 0] / kern.lambda_sigma - delta)
    # Both sides of every jump of F just above the start resolve the closely spaced crossings there;
    # farther jumps are left to the geometric grid (a wide teacher has thousands of them).
    breaks = breaks[(breaks > start) & (breaks < e_max)][:max_jumps]
    grid = np.unique(np.concatenate([[start], np.geomspace(max(start, e_max * 1e-15), e_max, grid_points),
                                     breaks * (1 - 1e-12), breaks * (1 + 1e-12)]))
    roots, kinds, jumps = _roots(h, grid, e_max)
    refuse_unless(roots, "no fixed point found; the kernel or readout is degenerate")  # h(0) > 0 >= h(e_max)
    eps = roots[0]
    snr = n_over_d * v2 / (delta + eps)
    q = kern.m(snr)
    return FixedPoint(eps=eps, eps_all=tuple(roots), kinds=tuple(kinds), jumps=tuple(jumps), q=q, snr=snr,
                      k_c=int(np.count_nonzero(q > 0)), n=n_val, d=d, k=k, r=n_val / (k * d), delta=delta,
                      lambda_sigma=kern.lambda_sigma, q_sigma=kern.q_sigma, g1=kern.g1, activation=kern.activation.name)


@dataclass(frozen=True)
class Sweep:
    """Fixed points over a range of sample sizes, as arrays (index j ↔ the j-th sample size)."""

    r: np.ndarray
    n: np.ndarray
    eps: np.ndarray
    k_c: np.ndarray
    q: np.ndarray  # shape (points, k)
    n_roots: np.ndarray
    d: int
    k: int
    delta: float
    lambda_sigma: float
    q_sigma: float
    to_dict = fields_dict  # a JSON-ready dict


def sweep(v: np.ndarray, *, delta: float, d: int, r_values: Union[Sequence[float], np.ndarray],
          activation: ActivationLike = "tanh2", kern: Optional[Kernel] = None, grid_points: int = 300) -> Sweep:
    """Solve the fixed point at each r = n/(kd) in ``r_values`` (see :func:`solve` for the errors)."""
    refuse_unless(len(r_values), "r_values must not be empty")
    kern = kern if kern is not None else kernel(activation)
    sols = [solve(v, delta=delta, d=d, r=float(r), kern=kern, grid_points=grid_points) for r in r_values]
    arrays: dict[str, Any] = {key: np.array([getattr(s, key) for s in sols]) for key in ("r", "n", "eps", "k_c", "q")}
    return Sweep(**arrays, n_roots=np.array([len(s.eps_all) for s in sols]), d=d, k=len(v), delta=delta,
                 lambda_sigma=kern.lambda_sigma, q_sigma=kern.q_sigma)


def fit_slope(x: np.ndarray, y: np.ndarray, *, min_points: int = 3) -> float:
    """Least-squares slope of log y against log x (NaN when fewer than ``min_points`` usable points)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    refuse_unless(x.shape == y.shape, f"x and y must have the same shape, got {x.shape} and {y.shape}")
    ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    refuse_unless(is_whole(min_points) and min_points >= 0, f"min_points must be an integer >= 0, got {min_points!r}")
    # One distinct x has no slope (polyfit raised LinAlgError on it).
    if np.count_nonzero(ok) < max(min_points, 2) or np.ptp(x[ok]) == 0:
        return math.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


@dataclass(frozen=True)
class RegimeFit:
    """Fitted exponents of ε(n) in the two regimes, with the predictions and the windows used."""

    feature_learning: float
    feature_learning_predicted: float
    feature_learning_window: tuple[float, float]
    refinement: float
    refinement_predicted: float
    refinement_window: tuple[float, float]
    reasons: dict = field(default_factory=dict)
    to_dict = fields_dict  # a JSON-ready dict


def fit_regimes(sw: Sweep, *, beta: float, kc_min: int = 8, kc_max_frac: float = 0.1,
                eps_max_over_delta: float = math.inf, refine_factor: float = 30.0) -> RegimeFit:
    """Fit ε ∝ n^a in the feature-learning and refinement regimes of a power-law sweep.

    Feature learning: the points with ``kc_min`` ≤ k_c ≤ ``kc_max_frac``·k and ε ≤
    ``eps_max_over_delta``·Δ (prediction 1/(2β) − 1, meaningful for β > ½; it assumes ε ≪ Δ, since
    snrᵢ ∝ n/(Δ + ε), and k_c ≪ k). Refinement: n ≥ ``refine_factor`` × the first n with k_c = k
    (prediction −1). A regime with fewer than 3 points is NaN with a reason.
    """
    reasons: dict[str, str] = {}
    fl = (sw.k_c >= kc_min) & (sw.k_c <= kc_max_frac * sw.k) & (sw.eps <= eps_max_over_delta * sw.delta)
    all_on = np.nonzero(sw.k_c == sw.k)[0]
    rf = sw.n >= refine_factor * sw.n[all_on[0]] if all_on.size else np.zeros_like(fl)
    a_fl = fit_slope(sw.n[fl], sw.eps[fl])
    a_rf = fit_slope(sw.n[rf], sw.eps[rf])
    if math.isnan(a_fl):
        reasons["feature_learning"] = _too_few_feature_learning(sw, fl, kc_min, kc_max_frac, eps_max_over_delta)
    elif beta <= 0.5:
        # ε then tracks the unlearned mass 1 − (k_c/k)^(1−2β) of a finite teacher: no power law in n.
        reasons["feature_learning"] = "the power law n^(1/(2beta)-1) is predicted for beta > 1/2 only"
    if math.isnan(a_rf):
        reasons["refinement"] = _too_few_refinement(sw, rf, all_on, refine_factor)

    def window(mask: np.ndarray) -> tuple[float, float]:
        return (float(sw.n[mask].min()), float(sw.n[mask].max())) if mask.any() else (math.nan, math.nan)

    # β = 0 (a dense readout): the prediction's limit, not a ZeroDivisionError.
    predicted = 1.0 / (2.0 * beta) - 1.0 if beta != 0 else math.inf
    return RegimeFit(a_fl, predicted, window(fl), a_rf, -1.0, window(rf), reasons)


def _too_few_refinement(sw: Sweep, rf: np.ndarray, all_on: np.ndarray, refine_factor: float) -> str:
    r_max = float(sw.r[-1])
    if not all_on.size:
        return (f"no point has all k={sw.k} features learned (k_c reaches {int(sw.k_c.max())} by r = {r_max:.3g}): "
                "raise --r-max")
    r_on = float(sw.r[all_on[0]])
    # r ≥ refine_factor·r_on; a decade of it is what a slope needs.
    return (f"{int(np.count_nonzero(rf))} point(s) in the refinement regime r >= {refine_factor:g} x {r_on:.3g} "
            f"(the first r with all k={sw.k} features learned) = {refine_factor * r_on:.3g}, up to r_max = "
            f"{r_max:.3g}; 3 are needed: raise --r-max to about {10 * refine_factor * r_on:.3g}")


def _too_few_feature_learning(sw: Sweep, fl: np.ndarray, kc_min: int, kc_max_frac: float,
                              eps_max_over_delta: float) -> str:
    band = (sw.k_c >= kc_min) & (sw.k_c <= kc_max_frac * sw.k)
    eps_rule = "" if math.isinf(eps_max_over_delta) else f" and eps <= {eps_max_over_delta:g}*Delta"
    head = (f"{int(np.count_nonzero(fl))} point(s) with {kc_min} <= k_c <= {kc_max_frac:g}*k = "
            f"{kc_max_frac * sw.k:g}{eps_rule}; 3 are needed")
    if not band.any():
        return head + ": k_c never enters that band in this sweep (raise --k, or widen --r-min/--r-max)"
    lo, hi = float(sw.r[band].min()), float(sw.r[band].max())
    return head + f": the band spans r = {lo:.3g} to {hi:.3g}; raise --points (or --k for a wider band)"


@dataclass(frozen=True)
class ScalingRow:
    """How k_c and ε scale with d at fixed r = n/(kd) and k = γd, for one readout family."""

    family: str
    kc_axis: str
    kc_slope: float
    kc_predicted: float
    eps_slope: float
    eps_predicted: float
    note: str
    d: tuple[int, ...]
    k_c: tuple[int, ...]
    eps: tuple[float, ...]
    off: str = ""  # why the predictions do not hold at these settings ("" where they do)
    to_dict = fields_dict  # a JSON-ready dict


# (label, readout kind, options, predicted slope of k_c, of ε, note) — derived in docs/math.md §6 terms:
# feature i is on when (n/d)·vᵢ²/(Δ+ε) > λ_σ, with n/d = r·γ·d. For ``exp`` k_c grows like
# ln(d)/(2c), so its k_c slope is fitted against ln d (prediction 1/(2c)), not log-log.
SCALING_FAMILIES: tuple[tuple[str, str, dict, float, float, str], ...] = (
    ("dense", "dense", {}, 1.0, 0.0, "all k features switch on together"),
    ("power beta=0.3", "power", {"beta": 0.3}, 1.0, 0.0, "k_c a fixed fraction of k"),
    ("power beta=0.5", "power", {"beta": 0.5}, 1.0, 0.0, "k_c ~ d/log d, eps ~ log log d/log d (log corrections)"),
    ("power beta=1.0", "power", {"beta": 1.0}, 0.5, -0.5, "k_c ~ d^(1/(2beta)), eps ~ d^(1/(2beta)-1)"),
    ("exp rate=0.2", "exp", {"rate": 0.2}, 2.5, -1.0, "k_c ~ ln(d)/(2c): slope vs ln d; eps ~ log(d)/d"),
    ("sparse p=3", "sparse", {"nonzeros": 3}, 0.0, -1.0, "k_c = p, eps ~ p*d/n ~ 1/d"),
)
# The families whose predictions have the cut-off inside the teacher, k_c < k (feature learning, not refinement).
_BELOW_K = ("power beta=1.0", "exp rate=0.2")


def _off(label: str, d_values: Sequence[int], kcs: Sequence[int], ks: Sequence[int], lambda_sigma: float) -> str:
    """Why a family's predicted slopes do not apply at these settings: a d where no feature is learned, or (for
    the families of :data:`_BELOW_K`) one where every feature is; "" where they apply."""
    none = [str(d) for d, kc in zip(d_values, kcs) if kc == 0]
    if none:
        return (f"k_c = 0 at d = {', '.join(none)}: no feature is learned (every snr_i stays below lambda_sigma = "
                f"{lambda_sigma:.4g}); the predictions are for learned features: raise r or lower delta")
    every = [str(d) for d, kc, k in zip(d_values, kcs, ks) if kc == k and label in _BELOW_K]
    return (f"k_c = k at d = {', '.join(every)}: every feature is learned (the refinement regime, k_c growing like "
            "d); the predicted slopes are for k_c < k: lower r or raise delta") if every else ""


def scaling_table(d_values: Sequence[int], *, r: float = 4.0, gamma: float = 0.5, delta: float = 0.04,
                  activation: ActivationLike = "tanh2") -> list[ScalingRow]:
    """One :class:`ScalingRow` per family of :data:`SCALING_FAMILIES`: the exponents of k_c(d) and ε(d)
    at fixed r = n/(kd) and k = γd, over at least 3 values of d.

    Raises:
        InvalidOptionError: fewer than 3 dimensions, a non-positive r, γ or Δ, or a γ·d too small for the sparse
            family's teacher.
    """
    refuse_unless(len(set(d_values)) >= 3 and all(is_whole(d) and d >= 1 for d in d_values),
                  f"need at least 3 different integers d >= 1, got {list(d_values)!r}")
    refuse_unless(all(finite_number(x) and x > 0 for x in (r, gamma, delta)),
                  f"r, gamma and delta must be positive and finite, got r={r!r}, gamma={gamma!r}, delta={delta!r}")
    # k = round(γd) grows with d, so the smallest d gives the smallest teacher; the sparse family needs p units.
    k_min, need = max(int(round(gamma * min(d_values))), 1), max(f[2].get("nonzeros", 1) for f in SCALING_FAMILIES)
    refuse_unless(k_min >= need, f"d = {min(d_values)} and gamma = {gamma:g} give k = round(gamma*d) = {k_min} teacher "
                  f"unit(s); the scaling table needs k >= {need}: raise the smallest d or gamma")
    kern = kernel(activation)
    ks = [max(int(round(gamma * d)), 1) for d in d_values]
    rows = []
    for label, kind, opts, kc_pred, eps_pred, note in SCALING_FAMILIES:
        sols = [solve(readout(kind, k, **opts), delta=delta, d=int(d), r=r, kern=kern, grid_points=300)
                for k, d in zip(ks, d_values)]
        kcs, epss = [sol.k_c for sol in sols], [sol.eps for sol in sols]
        dd = np.asarray(d_values, dtype=np.float64)
        kc_arr = np.asarray(kcs, dtype=np.float64)
        axis, kc_slope = (("k_c vs ln d", float(np.polyfit(np.log(dd), kc_arr, 1)[0])) if kind == "exp"
                          else ("log-log", fit_slope(dd, kc_arr) if np.all(kc_arr > 0) else math.nan))
        rows.append(ScalingRow(label, axis, kc_slope, kc_pred, fit_slope(dd, np.asarray(epss)), eps_pred, note,
                               tuple(int(x) for x in d_values), tuple(kcs), tuple(float(e) for e in epss),
                               _off(label, d_values, kcs, ks, kern.lambda_sigma)))
    return rows
