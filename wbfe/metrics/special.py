"""Log-space Tricomi U(a, b, z) on [0, ∞) and the branch cut (−∞, 0] (docs/math.md §3; scipy's ``hyperu`` fails there).

One Kummer-transformed integral, U(a, b, z) = z^(−a)/Γ(c)·∫₀^∞ e^(−u) u^(c−1) (1 + u/z)^(−a) du, c = a − b + 1 > 0, by
the trapezoidal rule in a sinh-stretched s = log u. On the cut z = −y − i0 the path bends below u = y: a ray through the
complex saddle inside the HTMP bulk, a Gaussian bump in θ around y outside it. Each value on the cut checks itself (step
doubling, cancellation, shifted nodes where the phase jumps); failures get finer steps or other paths, NaN only if
nothing converges to 1e-4."""

from __future__ import annotations

import math
from typing import Callable, Iterator, Optional, Union

import numpy as np
from scipy.special import expit, gammaln

from wbfe.errors import InvalidOptionError

__all__ = ["log_hyperu", "log_hyperu_neg", "log_abs_hyperu_neg", "arg_hyperu_neg"]

ArrayLike = Union[float, np.ndarray]
ComplexLike = Union[complex, np.ndarray]  # log U on the cut: complex, shaped like the argument

# Parts of an integrand below e^-46 of its peak are below double precision once summed.
_DROP = 46.0
# Rows with similar node counts are summed together; this bounds the padded work per chunk.
_CHUNK = 64
# Chunks of rows with node counts within 2x of each other where rtol <= _TIGHT_RTOL (see _chunks).
_CHUNK_SPREAD = 2.0
_TIGHT_RTOL = 1e-10
_MAX_NODES = 200_000
# Target relative accuracy of log U on the cut.
_CUT_TOL = 1e-13


def _check_ab(a: float, b: float) -> tuple[float, float, float]:
    a, b = float(a), float(b)
    c = a - b + 1.0
    if not (math.isfinite(a) and math.isfinite(b) and a > 0.0 and c > 0.0):
        raise InvalidOptionError(f"log-space U needs a > 0 and a - b + 1 > 0, not a={a!r}, b={b!r}")
    return a, b, c


def _log_sinh_trapezoid(
    log_integrand: Callable[[np.ndarray, np.ndarray], np.ndarray], s_c: np.ndarray, width: np.ndarray, step: np.ndarray,
    s_lo: np.ndarray, s_hi: np.ndarray, dtype: type, ref: Optional[np.ndarray] = None, spread: float = math.inf,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """log ∫ exp(f(s)) ds for one integrand ``f(s, rows)`` per row, by the trapezoidal rule in v, s = s_c + W·sinh v.
    Steps are at most ``step`` inside [s_c − W, s_c + W]; the sum runs over [s_lo, s_hi]. The phase is taken relative to
    the node nearest ``ref`` (complex integrands only); ``spread`` bounds a chunk's padding
    (:func:`_chunks`). Returns ``(fine, coarse, lost, shifted)``: the sum at the step and at twice it (their difference
    estimates the error), log(Σ|terms| / |Σ terms|) (digits lost to cancellation), and where the phase moves by more
    than 1 rad between significant nodes the sum on nodes shifted by a third of a step (NaN elsewhere): unresolved
    oscillation can alias alike at h and 2h, never at 0 and h/3."""
    v_lo = np.arcsinh((s_lo - s_c) / width)
    v_hi = np.arcsinh((s_hi - s_c) / width)
    # An s-step of at most `step` anywhere in [s_c - W, s_c + W] (cosh v <= sqrt 2 there).
    h = step / (width * math.sqrt(2.0))
    n = np.clip(np.ceil((v_hi - v_lo) / h).astype(np.int64) + 1, 16, _MAX_NODES)
    n += 1 - n % 2  # odd, so that every other node is the rule with twice the step
    out: np.ndarray = np.empty(s_c.shape, dtype=dtype)
    out_coarse: np.ndarray = np.empty(s_c.shape, dtype=dtype)
    lost = np.zeros(s_c.shape)
    shifted: np.ndarray = np.full(s_c.shape, complex(math.nan, math.nan) if dtype is complex else math.nan, dtype=dtype)
    order = np.argsort(n, kind="stable")
    for rows in _chunks(order, n, spread):
        nodes = int(n[rows].max())
        t = np.linspace(0.0, 1.0, nodes)
        v = v_lo[rows, None] + (v_hi - v_lo)[rows, None] * t
        hv = (v_hi - v_lo)[rows] / (nodes - 1)
        s = s_c[rows, None] + width[rows, None] * np.sinh(v)
        psi = log_integrand(s, rows)
        psi.real += np.log(width[rows, None] * np.cosh(v))  # a real array's .real is itself
        log_mod = psi.real
        # The modulus is normalised by the largest node, the phase by the reference node.
        top = np.max(log_mod, axis=1)
        modulus = np.exp(log_mod - top[:, None])
        if dtype is not complex:
            out[rows] = top + np.log(np.sum(modulus, axis=1) * hv)
            out_coarse[rows] = top + np.log(np.sum(modulus[:, ::2], axis=1) * 2.0 * hv)
            continue
        assert ref is not None
        k = np.argmin(np.abs(s - ref[rows, None]), axis=1)
        phase0 = psi.imag[np.arange(rows.size), k]
        peak = top + 1j * phase0
        # The terms exp(psi − peak) in real arithmetic: cheaper than numpy's complex exp.
        phase = psi.imag - phase0[:, None]
        t_re = modulus * np.cos(phase)
        t_im = modulus * np.sin(phase)
        out[rows] = peak + np.log((np.sum(t_re, axis=1) + 1j * np.sum(t_im, axis=1)) * hv)
        out_coarse[rows] = peak + np.log((np.sum(t_re[:, ::2], axis=1) + 1j * np.sum(t_im[:, ::2], axis=1)) * 2.0 * hv)
        lost[rows] = np.log(np.sum(modulus, axis=1) * hv) + top - out[rows].real
        # Unresolved oscillation can alias to a smooth wrong sum that halving cannot see: where
        # the phase moves more than 1 rad between significant nodes, sum again on shifted nodes.
        big = log_mod - top[:, None] > -30.0
        dphase = np.abs(np.diff(psi.imag, axis=1))
        jump = np.max(np.where(big[:, 1:] | big[:, :-1], dphase, 0.0), axis=1)
        moved = np.flatnonzero(jump > 1.0)
        if moved.size:
            v3 = v[moved] + hv[moved, None] / 3.0
            s3 = s_c[rows[moved], None] + width[rows[moved], None] * np.sinh(v3)
            psi3 = log_integrand(s3, rows[moved]) + np.log(width[rows[moved], None] * np.cosh(v3))
            total3 = np.sum(np.exp(psi3 - peak[moved, None]), axis=1) * hv[moved]
            value3 = peak[moved] + np.log(total3)
            # Not NaN: NaN marks the rows that were not checked.
            shifted[rows[moved]] = np.where(np.isfinite(value3), value3, complex(math.inf, math.inf))
    return out, out_coarse, lost, shifted


def _chunks(order: np.ndarray, n: np.ndarray, spread: float) -> Iterator[np.ndarray]:
    """Rows by ascending node count cut into chunks of at most _CHUNK, a new one also where a count exceeds
    ``spread`` times the chunk's first (one long row must not pad many short ones). Padding gives rows more
    nodes than asked, which some rows need at loose rtol: only tight ones use a finite spread."""
    start = 0
    while start < order.size:
        stop = min(order.size, start + _CHUNK)
        within = np.searchsorted(n[order[start:stop]], spread * n[order[start]], side="right")
        stop = start + max(1, int(within))
        yield order[start:stop]
        start = stop


def _bisect_decreasing(fn: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Root of a decreasing function, with fn(lo) >= 0 >= fn(hi), elementwise."""
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        pos = fn(mid) > 0.0
        lo = np.where(pos, mid, lo)
        hi = np.where(pos, hi, mid)
    return 0.5 * (lo + hi)


def _drop_edge(psi: Callable[[np.ndarray], np.ndarray], s_m: np.ndarray, scale: np.ndarray, sign: float) -> np.ndarray:
    """Point on one side of the maximum s_m of a concave psi where psi has dropped by _DROP."""
    top = psi(s_m) - _DROP
    dist = scale.copy()
    for _ in range(80):
        inside = psi(s_m + sign * dist) > top
        if not inside.any():
            break
        dist = np.where(inside, 2.0 * dist, dist)
    return _bisect_decreasing(lambda d: psi(s_m + sign * d) - top, np.zeros_like(dist), dist) * sign + s_m


def log_hyperu(a: float, b: float, z: ArrayLike) -> ArrayLike:
    """log U(a, b, z) of Tricomi's confluent hypergeometric function for real z >= 0, shaped like ``z``.

    Needs a > 0 and c = a − b + 1 > 0 (InvalidOptionError otherwise, or for a negative or non-finite z).
    At z = 0 this is log Γ(1−b) − log Γ(a−b+1) for b < 1 and +inf for b >= 1.

    Example:
        >>> round(float(log_hyperu(1.0, 1.0, 1.0)), 12)  # U(1, 1, z) = e^z E1(z)
        -0.516931959002
    """
    a, b, c = _check_ab(a, b)
    z_arr = np.asarray(z, dtype=np.float64)
    flat = np.atleast_1d(z_arr).ravel()
    if not np.all(np.isfinite(flat)) or np.any(flat < 0.0):
        raise InvalidOptionError("log_hyperu needs finite z >= 0 (use log_hyperu_neg on the cut)")
    out = np.empty(flat.shape)
    zero = flat == 0.0
    delta = 1.0 - b
    out[zero] = gammaln(delta) - gammaln(c) if delta > 0.0 else math.inf
    if np.any(~zero):
        out[~zero] = _log_hyperu_positive(a, c, flat[~zero])
    return float(out[0]) if z_arr.ndim == 0 else out.reshape(z_arr.shape)


def _log_hyperu_positive(a: float, c: float, z: np.ndarray) -> np.ndarray:
    """log U for z > 0: the integral of exp(psi), psi(s) = −e^s + δs − a·log(1 + z e^−s), s = log u."""
    delta = c - a
    lz = np.log(z)

    def psi(s: np.ndarray, lz_: np.ndarray) -> np.ndarray:
        # (1 + u/z)^(-a) z^(-a) u^c = u^δ (1 + z/u)^(-a): the prefactor z^-a is folded in exactly.
        return -np.exp(s) + delta * s - a * np.logaddexp(0.0, lz_ - s)

    def dpsi(s: np.ndarray) -> np.ndarray:
        return -np.exp(s) + c - a * expit(s - lz)

    # psi is strictly concave; its maximum has e^s in (δ, c) when δ > 0, below c in any case.
    hi = np.full_like(lz, math.log(c) + 1.0)
    lo = np.full_like(lz, math.log(c) - 1.0)
    for _ in range(200):
        bad = dpsi(lo) <= 0.0
        if not bad.any():
            break
        lo = np.where(bad, lo - 2.0 * (hi - lo), lo)
    s_m = _bisect_decreasing(dpsi, lo, hi)
    sig = expit(s_m - lz)
    sw = 1.0 / np.sqrt(np.exp(s_m) + a * sig * (1.0 - sig))
    s_lo, s_hi = (_drop_edge(lambda s: psi(s, lz), s_m, sw, sign) for sign in (-1.0, 1.0))
    # Uniform resolution over the peak, the (1 + z/u) corner at s = log z, and the e^-u cut-off;
    # to the left of both the integrand is a smooth slow exponential and the steps may grow.
    act_lo = np.maximum(s_lo, np.minimum(s_m - 4.0 * sw, lz - 3.0))
    width = np.maximum(0.5 * (s_hi - act_lo), sw)
    step = 0.8 * np.minimum(0.25, sw / 2.5)
    log_int, _, _, _ = _log_sinh_trapezoid(
        lambda s, rows: psi(s, lz[rows, None]), 0.5 * (act_lo + s_hi), width, step, s_lo, s_hi, float,
    )
    return log_int - gammaln(c)


def log_hyperu_neg(a: float, b: float, y: ArrayLike, *, rtol: float = 1e-13, modulus_only: bool = False) -> ComplexLike:
    """log U(a, b, −y − i0) on the branch cut (a > 0, b < 1, y >= 0), with an argument continuous in y.

    The imaginary part is arg U from below the cut, continued from 0 at y = 0: it runs from 0 to πa, which the HTMP CDF
    F = arg U / (πa) needs. From above the cut the value is the complex conjugate. A path is accepted once halving its
    step changes log U by less than sqrt(rtol)·max(1, |log U|) (the finer sum's error is about the square of that);
    values for which no path gets below 1e-4 are NaN. ``modulus_only``: only the real part is wanted
    (:func:`log_abs_hyperu_neg`)."""
    a, b, c = _check_ab(a, b)
    if not b < 1.0:
        raise InvalidOptionError(f"log_hyperu_neg needs b < 1, not b={b!r}")
    y_arr = np.asarray(y, dtype=np.float64)
    flat = np.atleast_1d(y_arr).ravel()
    if not np.all(np.isfinite(flat)) or np.any(flat < 0.0):
        raise InvalidOptionError("log_hyperu_neg needs finite y >= 0 (the point on the cut is -y)")
    out = np.empty(flat.shape, dtype=complex)
    zero = flat == 0.0
    delta = 1.0 - b
    log_a0 = gammaln(delta) - gammaln(c)
    out[zero] = log_a0
    # Near 0, U = Γ(δ)/Γ(c)·M(a, b, z) + Γ(−δ)/Γ(a)·z^δ·M(c, 1+δ, z) with both M = 1 + O(z):
    # below y_small the O(z) terms are under 1e-16 and the two leading terms are exact.
    tiny = (flat > 0.0) & (flat <= 1e-17 * min(1.0, abs(1.0 - delta)) / (1.0 + a + c))
    if tiny.any():
        out[tiny] = _log_hyperu_cut_near_zero(a, c, delta, log_a0, flat[tiny])
    rest = ~zero & ~tiny
    if np.any(rest):
        out[rest] = _log_hyperu_cut(a, c, flat[rest], rtol, modulus_only)
    return complex(out[0]) if y_arr.ndim == 0 else out.reshape(y_arr.shape)


def _log_hyperu_cut_near_zero(a: float, c: float, delta: float, log_a0: float, y: np.ndarray) -> np.ndarray:
    """log[Γ(δ)/Γ(c) + Γ(−δ)/Γ(a)·(y e^(−iπδ))^δ] for y so small that the O(y) terms vanish."""
    if delta >= 1.0 or delta == round(delta):
        # The z^δ term is O(y) or smaller: below y_small it is below rounding.
        return np.full(y.shape, complex(log_a0))
    # Γ(−δ) < 0 for 0 < δ < 1: the second term is −|Γ(−δ)|/Γ(a)·y^δ e^(−iπδ).
    log_ratio = gammaln(-delta) - gammaln(a) - log_a0
    r = -np.exp(log_ratio + delta * np.log(y) - 1j * math.pi * delta)
    return log_a0 + np.log1p(r)


def log_abs_hyperu_neg(a: float, b: float, y: ArrayLike, *, rtol: float = _CUT_TOL) -> ArrayLike:
    """log |U(a, b, −y)| on the cut; cheaper than :func:`log_hyperu_neg` (with no phase to keep, other paths first)."""
    value = log_hyperu_neg(a, b, y, rtol=rtol, modulus_only=True)
    return value.real if isinstance(value, np.ndarray) else float(value.real)


def arg_hyperu_neg(a: float, b: float, y: ArrayLike) -> ArrayLike:
    """arg U(a, b, −y − i0), continuous in y from 0 at y = 0; see :func:`log_hyperu_neg`."""
    value = log_hyperu_neg(a, b, y)
    return value.imag if isinstance(value, np.ndarray) else float(value.imag)


# Fallback paths (θ0, bump width; inf = a ray at angle θ0) for rows where the default path's
# trapezoidal sum has not converged; the order puts the cheapest, most often right, first.
_CUT_FALLBACKS = (
    (0.2, 0.4), (0.4, math.inf), (0.1, 0.2), (0.5, 0.3), (1.0, 0.3), (1.0, 1.0), (0.2, math.inf), (0.1, math.inf),
    (0.3, 0.8), (0.7, math.inf), (0.5, 0.1), (1.4, 0.3),
)
_CUT_MAX_LOST = math.log(1e3)


def _cut_integral(
    a: float, c: float, y: np.ndarray, ly: np.ndarray, th0: np.ndarray, bump_w: np.ndarray, peak: np.ndarray,
    step: np.ndarray, act_lo: np.ndarray, act_hi: np.ndarray, spread: float = math.inf,
) -> tuple[np.ndarray, np.ndarray]:
    """log J along log u = s − iθ0·exp(−½((s − log y)/w)²) (w = inf: a ray), and |J_h − J_2h|."""
    # Left of both the peak and u = y the integrand falls like u^c: e^-50 takes 50/c in s.
    s_lo = np.minimum(act_lo, np.minimum(peak, ly)) - 50.0 / c - 5.0
    s_hi = np.maximum(math.log(c + a + 60.0 * math.sqrt(c) + 60.0), act_hi) + 1.0
    width = 0.5 * (act_hi - act_lo)

    def log_integrand(s: np.ndarray, rows: np.ndarray) -> np.ndarray:
        # In real arithmetic (cheaper than numpy's complex exp/log/divide): u = e^s e^(−iθ), θ = θ0·g(s),
        # and the Jacobian 1 − iθ0·g'(s) of the bent path.
        t0 = th0[rows, None]
        w = bump_w[rows, None]
        z = (s - ly[rows, None]) / w  # 0 on a ray (w = inf): g = 1, g' = 0
        theta = t0 * np.exp(-0.5 * z * z)
        e_s = np.exp(s)
        u_re = e_s * np.cos(theta)
        u_im = e_s * np.sin(theta)  # u = u_re − i·u_im, u_im >= 0 (θ in [0, π/2))
        inv_y = 1.0 / y[rows, None]
        # 1 − u/y lies in the closed upper half plane, so its principal log is the continuous one.
        one_re = 1.0 - u_re * inv_y
        one_im = u_im * inv_y
        out = np.empty(s.shape, dtype=complex)
        out.real = c * s - u_re - (0.5 * a) * np.log(one_re * one_re + one_im * one_im)
        out.imag = u_im - c * theta - a * np.arctan2(one_im, one_re)
        bent = ~np.isinf(bump_w[rows])
        if bent.any():
            # log(1 − i·q), q = θ0·g' = −θ·z/w
            q = -(theta[bent] * z[bent]) / w[bent]
            out.real[bent] += 0.5 * np.log1p(q * q)
            out.imag[bent] -= np.arctan(q)
        return out

    fine, coarse, lost, shifted = _log_sinh_trapezoid(
        log_integrand, 0.5 * (act_lo + act_hi), width, step, s_lo, s_hi, complex, ref=peak, spread=spread
    )
    err = np.abs(fine - coarse)
    # The shifted sum has the fine sum's own error, not its square: map its difference to the
    # same scale as |J_h − J_2h| (accepting ε <= sqrt(rtol)·M then means |J_h − J_h/3| <= rtol·M).
    check = ~np.isnan(shifted.real)
    scale = np.maximum(1.0, np.abs(fine))
    err[check] = np.maximum(err[check], np.sqrt(np.abs(fine[check] - shifted[check]) * scale[check]))
    # A path along which the terms cancel by more than 1e3 cannot give 1e-13: treat as unconverged.
    ok = np.isfinite(err) & (lost < _CUT_MAX_LOST)
    return fine, np.where(ok, err, np.inf)


def _centred_map(
    a: float, c: float, ly: np.ndarray, near_y: np.ndarray, near_y_step: np.ndarray, peak: np.ndarray,
    peak_half: np.ndarray, peak_step: np.ndarray, act_lo: np.ndarray, act_hi: np.ndarray, step: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, the cheaper of two sinh maps for :func:`_cut_integral`, as (act_lo, act_hi, step). Either the uniform
    region [act_lo, act_hi] at ``step``, or one centred on log y (half-width ``near_y``, step ``near_y_step``) whose
    steps grow away from y and are still ``peak_step`` across the peak's region (peak ± peak_half): the fine step near y
    is then not spent over a wide peak (small c)."""
    reach = np.abs(peak - ly) + peak_half
    centred_step = np.minimum(near_y_step, near_y * math.sqrt(2.0) * peak_step / np.hypot(reach, near_y))
    top = math.log(c + a + 60.0 * math.sqrt(c) + 60.0)

    def nodes(lo: np.ndarray, hi: np.ndarray, h: np.ndarray) -> np.ndarray:
        # as _cut_integral and _log_sinh_trapezoid count them
        s_lo = np.minimum(lo, np.minimum(peak, ly)) - 50.0 / c - 5.0
        s_hi = np.maximum(top, hi) + 1.0
        centre, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
        return (np.arcsinh((s_hi - centre) / half) - np.arcsinh((s_lo - centre) / half)) * half * math.sqrt(2.0) / h

    centred = nodes(ly - near_y, ly + near_y, centred_step) < nodes(act_lo, act_hi, step)
    return (np.where(centred, ly - near_y, act_lo), np.where(centred, ly + near_y, act_hi),
            np.where(centred, centred_step, step))


def _log_hyperu_cut(
    a: float, c: float, y: np.ndarray, rtol: float = _CUT_TOL, modulus_only: bool = False
) -> np.ndarray:
    """log U(a, b, −y − i0) for y > 0 along a path below u = y (see the module docstring)."""
    ly = np.log(y)
    # Saddles of e^-u u^c (1 - u/y)^-a:  u² − (y + c − a)u + yc = 0.
    big_b = y + c - a
    disc = (y - c) ** 2 - 2.0 * a * (y + c) + a * a
    bulk = disc < 0.0
    # Near a bulk edge two saddles merge (Airy scale c^-1/3): angles below that are not resolved.
    th_min = min(0.05, 0.5 * c ** (-1.0 / 3.0))

    th0, bump_w, peak, step, act_lo, act_hi = (np.empty_like(y) for _ in range(6))

    # Bulk: a ray at the angle of the lower complex saddle, which it crosses.
    root = np.sqrt(np.abs(disc))
    us = 0.5 * (big_b - 1j * root)
    q = us / y
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d2 = -us + a * q / (1.0 - q) ** 2  # psi'' at the saddle along the ray
        cos_phi = np.clip(-d2.real / np.abs(d2), 0.05, 1.0)
        sw_b = np.minimum(1.0 / np.sqrt(np.abs(d2)), 1.0)  # a zero curvature: width 1
    angle = np.maximum(np.arctan2(root, big_b), th_min)
    env_b = sw_b / np.sqrt(cos_phi)
    peak_b = 0.5 * (ly + math.log(c))
    th0[bulk], bump_w[bulk], peak[bulk] = angle[bulk], np.inf, peak_b[bulk]
    strip = (0.5 * math.pi - angle) / 8.0
    saddle_step = np.minimum.reduce([0.35 * sw_b * np.sqrt(cos_phi), np.full_like(y, 0.25), strip])
    near_y_step = np.minimum.reduce([angle / 6.0, np.full_like(y, 0.25), strip])
    lo_b, hi_b, step_b = _centred_map(
        a, c, ly, 3.0 * angle, near_y_step, peak_b, 8.0 * env_b,
        saddle_step, np.minimum(peak_b - 8.0 * env_b, ly - 3.0 * angle),
        np.maximum(peak_b + 8.0 * env_b, ly + 3.0 * angle), np.minimum(saddle_step, near_y_step),
    )
    step[bulk], act_lo[bulk], act_hi[bulk] = step_b[bulk], lo_b[bulk], hi_b[bulk]

    # Outside the bulk: real saddles on one side of y; the real-axis mode of the integrand is
    # the peak, and a Gaussian bump in θ takes the path around y without reaching the mode.
    out = ~bulk
    if out.any():
        yo, lyo, bo, ro = y[out], ly[out], big_b[out], root[out]
        u2 = 0.5 * (bo + ro)
        u1 = yo * c / u2
        mode = np.where(u1 > yo, u2, u1)
        near = np.minimum(np.abs(np.log(u1 / yo)), np.abs(np.log(u2 / yo)))
        w = np.maximum(near, th_min)
        w = np.minimum(w, np.maximum(np.abs(lyo - np.log(mode)) / 6.0, th_min))
        t0 = np.minimum(1.2, np.maximum(w, th_min))
        qm = mode / yo
        with np.errstate(divide="ignore", over="ignore"):
            curv = np.abs(-mode + a * qm / (1.0 - qm) ** 2)
            swo = np.minimum(1.0 / np.sqrt(curv), 1.0)
        sm = np.log(mode)
        th0[out], bump_w[out], peak[out] = t0, w, sm
        # The e^-u strip narrows with θ only where |u| is not small: near the mode, not at a
        # bump around a y far below it.
        t_mode = t0 * np.exp(-0.5 * ((sm - lyo) / w) ** 2)
        t_strip = np.where(lyo + 3.0 * w > math.log(0.1), t0, t_mode)
        mode_step = np.minimum.reduce([0.35 * swo, np.full_like(yo, 0.25), (0.5 * math.pi - t_mode) / 8.0])
        bump_step = np.minimum.reduce([np.full_like(yo, 0.25), w / 4.0, (0.5 * math.pi - t_strip) / 8.0])
        act_lo[out], act_hi[out], step[out] = _centred_map(
            a, c, lyo, 4.0 * w, bump_step, sm, 8.0 * swo, mode_step,
            np.minimum(sm - 8.0 * swo, lyo - 4.0 * w), np.maximum(sm + 8.0 * swo, lyo + 4.0 * w),
            np.minimum(0.35 * swo, bump_step),
        )

    # The steps above give ~1e-13; the trapezoidal error falls like e^(−k/h), so a looser target
    # allows proportionally longer steps (log rtol / log 1e-13 of them), up to twice as long.
    step = step * min(2.0, max(1.0, math.log(_CUT_TOL) / math.log(min(rtol, 0.1))))
    spread = _CHUNK_SPREAD if rtol <= _TIGHT_RTOL else math.inf
    log_j, err = _cut_integral(a, c, y, ly, th0, bump_w, peak, step, act_lo, act_hi, spread)
    # The trapezoidal error falls like e^(−k/h): if the sums at h and 2h differ by ε, the one at
    # h is off by about ε². Accept ε <= sqrt(rtol), scaled by the size of log J.
    accept = math.sqrt(rtol) * np.maximum(1.0, np.abs(log_j))
    refined: dict[int, list[complex]] = {}

    def keep(rows: np.ndarray, cand: np.ndarray, cand_err: np.ndarray, seen: dict[int, list[complex]]) -> None:
        better = cand_err < err[rows]
        log_j[rows[better]] = cand[better]
        err[rows[better]] = cand_err[better]
        for row, value in zip(rows, cand):
            seen.setdefault(int(row), []).append(value)

    def other_paths() -> None:
        # The path is free: where halving the step changes the default path's sum, try others
        # (rays, then wider or lower bumps) and keep the first that has converged, else the best.
        votes: dict[int, list[complex]] = {}
        for kind_th, kind_w in _CUT_FALLBACKS:
            rows = np.flatnonzero(err > accept)
            if not rows.size:
                break
            yb, lyb = y[rows], ly[rows]
            sw = min(1.0, 1.0 / math.sqrt(c + a))
            stp = 0.5 * min(0.35 * sw, 0.25, kind_th / 6.0, (0.5 * math.pi - kind_th) / 8.0, kind_w / 8.0)
            lo = np.minimum(peak[rows] - 8.0 * sw, lyb - 4.0 * min(kind_w, 3.0))
            hi = np.maximum(peak[rows] + 8.0 * sw, lyb + 4.0 * min(kind_w, 3.0))
            cand, cand_err = _cut_integral(a, c, yb, lyb, np.full_like(yb, kind_th), np.full_like(yb, kind_w),
                                           peak[rows], np.full_like(yb, stp), lo, hi, spread)
            keep(rows, cand, cand_err, votes)
        # J does not depend on the path: where no single path passed its checks but three or more
        # different paths give the same log J, that common value is the answer.
        for row, values in votes.items():
            if err[row] <= accept[row]:
                continue
            vals = np.array(values)
            vals = vals[np.isfinite(vals)]
            for v in vals:
                if np.sum(np.abs(vals - v) <= 1e-10 * max(1.0, abs(v))) >= 3:
                    log_j[row], err[row] = v, 0.0
                    break

    def refine() -> None:
        # Unsettled rows get the default path with steps 4 and 16 times finer.
        for factor in (0.25, 0.0625):
            rows = np.flatnonzero(err > accept)
            if not rows.size:
                break
            cand, cand_err = _cut_integral(
                a, c, y[rows], ly[rows], th0[rows], bump_w[rows], peak[rows], factor * step[rows],
                act_lo[rows], act_hi[rows], spread,
            )
            keep(rows, cand, cand_err, refined)

    # Refining costs 4 and 16 times more than another path but keeps the phase reference (another
    # path's sum may be 2π away): only for the modulus do the cheap paths go first.
    if modulus_only:
        other_paths()
        refine()
    else:
        refine()
        other_paths()
    # Steps 4 and 16 times finer than the default path's agreeing is convergence as well, even
    # where the cancellation or phase checks were too cautious to accept either sum.
    for row, values in refined.items():
        if err[row] > accept[row] and len(values) == 2 and np.all(np.isfinite(values)):
            gap = abs(values[1] - values[0])
            if gap <= 1e-8 * max(1.0, abs(values[1])):
                log_j[row], err[row] = values[1], gap
    # No path converged even loosely: say so.
    log_j = np.where(err <= 1e-4 * np.maximum(1.0, np.abs(log_j)), log_j, complex(math.nan, math.nan))
    # U(a, b, −y − i0) = (y e^{−iπ})^(−a) / Γ(c) · J
    return -a * ly + 1j * math.pi * a - gammaln(c) + log_j
