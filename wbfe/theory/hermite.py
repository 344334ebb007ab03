"""Hermite coefficients of an activation, the kernel g and the scalar channel m (docs/math.md §6).

The series of g is truncated at degree L with its remainder at q = 1 carried as one more term R·q^(L+1),
so g(1) is exact; m is read from a table of its branch above λ_σ in u = −ln(1 − q), which keeps q → 1
at full precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Union

import numpy as np

from wbfe.errors import InvalidOptionError, unknown_name
from wbfe.theory.checks import is_whole, refuse_unless

__all__ = ["Activation", "ACTIVATIONS", "get_activation", "hermite_coefficients", "Kernel", "kernel"]

ArrayLike = Union[float, np.ndarray]
MAX_DEGREE = 5000  # the kernel's table of m then holds 12,000 x (degree + 2) floats (0.5 GB)


@dataclass(frozen=True)
class Activation:
    """A pointwise activation as a vectorised numpy function and, when known, a torch one (``custom``: a callable).

    ``kinks`` are the points where it is not smooth (quadrature panels break there).
    """

    name: str
    numpy: Callable[[np.ndarray], np.ndarray]
    torch: Callable[[Any], Any] | None = None
    kinks: tuple[float, ...] = ()


def _erf_np(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


# The torch forms are the tensors' own methods, so that this module never imports torch.
ACTIVATIONS: dict[str, Activation] = {
    "tanh2": Activation("tanh2", lambda x: np.tanh(2.0 * x), lambda x: (2.0 * x).tanh()),
    "tanh": Activation("tanh", np.tanh, lambda x: x.tanh()),
    "erf": Activation("erf", _erf_np, lambda x: x.erf()),
    "relu": Activation("relu", lambda x: np.maximum(x, 0.0), lambda x: x.relu(), kinks=(0.0,)),
}


def get_activation(activation: Union[str, Activation, Callable[[np.ndarray], np.ndarray]]) -> Activation:
    """Resolve a name, an :class:`Activation` or a numpy callable to an :class:`Activation`.

    Raises:
        UnknownNameError: an unknown activation name.
    """
    if isinstance(activation, Activation):
        return activation
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise unknown_name("activation", activation, list(ACTIVATIONS))
        return ACTIVATIONS[activation]
    if callable(activation):
        return Activation("custom", activation)
    raise InvalidOptionError(f"activation must be a name or a callable, got {type(activation).__name__}")


def _legendre_panels(lo: float, hi: float, breaks: tuple[float, ...], width: float,
                     order: int) -> tuple[np.ndarray, np.ndarray]:
    # Composite Gauss-Legendre: exact panels edges at the kinks keep piecewise-smooth integrands exact.
    edges = sorted({lo, hi, *[b for b in breaks if lo < b < hi]})
    cuts = np.unique(np.concatenate([np.linspace(a, b, max(1, math.ceil((b - a) / width)) + 1)
                                     for a, b in zip(edges[:-1], edges[1:])]))
    half, mid = 0.5 * np.diff(cuts), 0.5 * (cuts[:-1] + cuts[1:])
    x0, w0 = np.polynomial.legendre.leggauss(order)
    return (mid[:, None] + half[:, None] * x0).ravel(), (half[:, None] * w0).ravel()


def _normalised_coefficients(act: Activation, degree: int) -> tuple[np.ndarray, float]:
    """c_ℓ = E[σ(z)·He_ℓ(z)]/√ℓ! for ℓ = 0..degree, and E[σ(z)²], by one quadrature."""
    if not is_whole(degree) or not 2 <= degree <= MAX_DEGREE:
        raise InvalidOptionError(f"degree must be >= 2 and <= {MAX_DEGREE} (an integer), got {degree!r}")
    degree = int(degree)
    half_width = 2.0 * math.sqrt(degree + 1.0) + 14.0
    z, w = _legendre_panels(-half_width, half_width, act.kinks, width=0.25, order=24)
    message = "the activation must map a float64 array to finite values of the same shape"
    try:
        sig = np.asarray(act.numpy(z), dtype=np.float64)
    except (ArithmeticError, TypeError, ValueError) as exc:  # e.g. math.tanh, which takes scalars only
        raise InvalidOptionError(f"{message} ({exc})") from None
    refuse_unless(sig.shape == z.shape and np.all(np.isfinite(sig)), message)
    # Orthonormal Hermite functions ψ_ℓ = h_ℓ·√φ stay bounded, so the recurrence never overflows.
    root_phi = (2.0 * math.pi) ** -0.25 * np.exp(-0.25 * z * z)
    weighted = w * sig * root_phi
    coef = np.empty(degree + 1)
    prev, cur = np.zeros_like(z), root_phi
    for ell in range(degree + 1):
        coef[ell] = float(np.dot(weighted, cur))
        prev, cur = cur, (z * cur - math.sqrt(ell) * prev) / math.sqrt(ell + 1.0)
    return coef, float(np.dot(w * sig * sig, root_phi * root_phi))


def hermite_coefficients(activation: Union[str, Activation, Callable], degree: int = 300) -> np.ndarray:
    """Probabilists' Hermite coefficients μ_ℓ = E[σ(z)·He_ℓ(z)], z ~ N(0, 1), for ℓ = 0..degree (float64).

    Raises:
        InvalidOptionError: ``degree`` < 2, or the activation does not return finite values.
    """
    coef, _ = _normalised_coefficients(get_activation(activation), degree)
    return coef * np.exp(0.5 * np.array([math.lgamma(ell + 1.0) for ell in range(len(coef))]))  # × √ℓ!


@dataclass(frozen=True, eq=False)
class Kernel:
    """The kernel g of an activation and its scalar channel m (see the module docstring).

    Attributes:
        c2: squared normalised coefficients c_ℓ² for ℓ = 0..L (entries 0 and 1 are set to 0).
        remainder: R = E[σ̃²] − Σ_{ℓ=2..L} c_ℓ² (≥ 0 up to rounding), carried as R·q^(L+1).
        mu: μ₀, μ₁, μ₂ (the raw Hermite coefficients of degrees 0–2).
    """

    activation: Activation
    c2: np.ndarray
    remainder: float
    mu: tuple[float, float, float]

    @property
    def degree(self) -> int:
        """Truncation degree L of the series."""
        return len(self.c2) - 1

    @property
    def g1(self) -> float:
        """g(1) = E[σ̃(z)²]."""
        return float(self.c2.sum() + self.remainder)

    @cached_property
    def _weights(self) -> np.ndarray:
        return np.append(self.c2, self.remainder)  # of q^0 .. q^(L+1)

    def g(self, q: ArrayLike) -> np.ndarray:
        """g(q) for q in [0, 1] (vectorised)."""
        return np.polynomial.polynomial.polyval(np.asarray(q, dtype=np.float64), self._weights)

    def g_prime(self, q: ArrayLike) -> np.ndarray:
        """g'(q) (vectorised)."""
        w = self._weights
        return np.polynomial.polynomial.polyval(np.asarray(q, dtype=np.float64), np.arange(1.0, len(w)) * w[1:])

    def deficit(self, s: ArrayLike) -> np.ndarray:
        """g(1) − g(1 − s), accurate also when s = 1 − q is far below machine precision of q."""
        log_q = np.log1p(-np.clip(np.asarray(s, dtype=np.float64), 0.0, 1.0))[..., None]
        with np.errstate(invalid="ignore"):
            one_minus_qell = -np.expm1(np.arange(self.degree + 2.0) * log_q)
        return np.where(np.isfinite(one_minus_qell), one_minus_qell, 1.0) @ self._weights

    @cached_property
    def threshold(self) -> tuple[float, float]:
        """(λ_σ, q_σ): λ_σ = inf_{q∈(0,1)} (−q − ln(1−q))/g(q), q_σ its minimiser (0 when μ₂ ≠ 0)."""
        from scipy.optimize import minimize_scalar

        def ratio(q: np.ndarray) -> np.ndarray:
            return (-np.log1p(-q) - q) / self.g(q)

        u = np.concatenate([np.geomspace(1e-6, 1.0, 400), np.linspace(1.0, 30.0, 2000)[1:]])
        q = -np.expm1(-u)
        vals = ratio(q)
        i = int(np.argmin(vals))
        limit0 = 1.0 / (2.0 * self.c2[2]) if self.c2[2] > 0 else math.inf
        if i == 0 or limit0 <= vals[i] * (1 + 1e-12):
            return float(min(limit0, vals[0])), 0.0
        res = minimize_scalar(lambda x: float(ratio(np.array(x))), bounds=(q[i - 1], q[min(i + 1, len(q) - 1)]),
                              method="bounded", options={"xatol": 1e-13})
        return float(res.fun), float(res.x)

    @property
    def lambda_sigma(self) -> float:
        """λ_σ, where m switches on."""
        return self.threshold[0]

    @property
    def q_sigma(self) -> float:
        """q_σ = m(λ_σ⁺): the size of the jump (0 for a continuous onset)."""
        return self.threshold[1]

    @cached_property
    def _table(self) -> tuple[Any, Any, float, float]:
        from scipy.interpolate import CubicSpline

        q_sig = self.q_sigma
        u = (np.linspace(-math.log1p(-q_sig), 60.0, 12000) if q_sig > 0
             else np.concatenate([np.geomspace(1e-9, 1.0, 3000), np.linspace(1.0, 60.0, 10000)[1:]]))
        s = np.exp(-u)
        q = -np.expm1(-u)
        lam = q / (s * self.g_prime(q))
        if q_sig == 0.0:
            lam[0] = max(lam[0], self.lambda_sigma)
        x = np.log(lam)
        refuse_unless(np.all(np.diff(x) > 0), f"activation {self.activation.name!r}: the branch of m above "
                      "lambda_sigma is not monotone (a second transition); not supported")
        return CubicSpline(x, u), CubicSpline(u, np.log(self.deficit(s))), float(x[-1]), float(self.g_prime(1.0))

    def m(self, lam: ArrayLike) -> np.ndarray:
        """m(λ), vectorised: 0 for λ < λ_σ, the global argmax (≥ q_σ) for λ ≥ λ_σ."""
        return -np.expm1(-self._log_one_minus_m(lam))

    def deficit_at(self, lam: ArrayLike) -> np.ndarray:
        """g(1) − g(m(λ)), vectorised and accurate when m(λ) is within 1e-16 of 1."""
        u = self._log_one_minus_m(lam)
        _, logdef_of_u, _, gp1 = self._table
        out = np.full(u.shape, self.g1)
        inside = (u > 0) & (u <= 60.0)
        out[inside] = np.exp(logdef_of_u(u[inside]))
        far = u > 60.0
        out[far] = gp1 * np.exp(-u[far])
        return out

    def _log_one_minus_m(self, lam: ArrayLike) -> np.ndarray:
        # Returns u = −ln(1 − m(λ)) (0 where m = 0).
        lam = np.asarray(lam, dtype=np.float64)
        u_of_x, _, x_max, gp1 = self._table
        u = np.zeros(lam.shape)
        on = lam >= self.lambda_sigma  # > 0, so the log below never sees 0
        x = np.log(np.where(on, lam, 1.0))
        inside = on & (x <= x_max)
        u[inside] = u_of_x(x[inside])
        far = on & (x > x_max)
        u[far] = x[far] + math.log(gp1)  # 1 − q ≈ 1/(λ·g'(1)) as q → 1
        return u


def kernel(activation: Union[str, Activation, Callable] = "tanh2", *, degree: int = 300) -> Kernel:
    """The :class:`Kernel` of an activation, its Hermite series truncated at ``degree`` (cached per name and degree).

    Raises:
        InvalidOptionError: ``degree`` < 2, a non-finite activation, or a g that vanishes.
        UnknownNameError: an unknown activation name.
    """
    act = get_activation(activation)
    # An unhashable degree is not cached: _normalised_coefficients refuses it with its name.
    key = (act.name, degree) if act.name != "custom" and is_whole(degree) else None
    if key is not None and key in _KERNELS:
        return _KERNELS[key]
    coef, second = _normalised_coefficients(act, degree)
    c2 = coef**2
    mu = (float(coef[0]), float(coef[1]), float(coef[2] * math.sqrt(2.0)))
    c2[:2] = 0.0
    remainder = max(second - coef[0] ** 2 - coef[1] ** 2 - float(c2.sum()), 0.0)
    refuse_unless(c2.sum() + remainder > 1e-14, f"activation {act.name!r} is affine: its kernel g vanishes")
    out = Kernel(act, c2, float(remainder), mu)
    return out if key is None else _KERNELS.setdefault(key, out)


_KERNELS: dict[tuple[str, int], Kernel] = {}
