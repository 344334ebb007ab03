"""The hierarchical target of docs/math.md §7: latent degree-2 Hermite features and a power-law readout.

A vector v ∈ R^D and a symmetric matrix A ∈ R^{d×d} are the same object: A_ii = v_ii,
A_ij = v_ij/√2, so that ⟨v, z(x)⟩ = (xᵀAx − Tr A)/√2 and ‖A‖_F = ‖v‖. The matrix-free operators
below never build z(x) for the Hermite features: they work with A.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from wbfe.errors import unknown_name
from wbfe.theory.checks import check_seed, finite_number, is_whole, refuse_unless

__all__ = ["ACTIVATIONS", "FEATURE_KINDS", "HierarchicalTeacher", "FeatureData", "feature_dim", "vec_to_sym",
           "sym_to_vec", "hermite_features", "make_teacher", "sample_data"]

ACTIVATIONS = ("identity", "tanh")
FEATURE_KINDS = ("hermite", "gaussian")
_CHUNK = 32768  # rows per block: bounds the n×d·k temporaries of the matrix-free products
MC_SAMPLES = 400_000  # Monte Carlo size for the constants of a non-linear g*
_MC_SEED = 20260514


def feature_dim(d: int) -> int:
    """D = d(d+1)/2, the number of degree-2 Hermite features of x ∈ R^d."""
    return d * (d + 1) // 2


def vec_to_sym(v: np.ndarray, d: int) -> np.ndarray:
    """Map vectors in R^D, shape (D,) or (D, k), to symmetric matrices, (d, d) or (k, d, d), with
    ⟨v, z⟩ = (xᵀAx − Tr A)/√2; coordinates are ordered diagonal first, then (i < j) row-major."""
    v = np.asarray(v, dtype=np.float64)
    cols = v.reshape(v.shape[0], -1)
    iu, ju = np.triu_indices(d, 1)
    out = np.zeros((cols.shape[1], d, d))
    out[:, np.arange(d), np.arange(d)] = cols[:d].T
    out[:, iu, ju] = out[:, ju, iu] = cols[d:].T / math.sqrt(2.0)
    return out[0] if v.ndim == 1 else out


def sym_to_vec(a: np.ndarray) -> np.ndarray:
    """Inverse of :func:`vec_to_sym`: symmetric (d, d) or (k, d, d) matrices to (D,) or (D, k)."""
    a = np.asarray(a, dtype=np.float64)
    mats = a.reshape(-1, *a.shape[-2:])
    iu, ju = np.triu_indices(a.shape[-1], 1)
    v = np.concatenate([np.diagonal(mats, axis1=1, axis2=2), math.sqrt(2.0) * mats[:, iu, ju]], axis=1).T
    return v[:, 0] if a.ndim == 2 else v


def hermite_features(x: np.ndarray) -> np.ndarray:
    """The explicit feature map z(x): (n, d) → (n, D) (only for small d; the learners stay matrix-free)."""
    x = np.asarray(x, dtype=np.float64)
    iu, ju = np.triu_indices(x.shape[1], 1)
    return np.concatenate([(x * x - 1.0) / math.sqrt(2.0), x[:, iu] * x[:, ju]], axis=1)


@dataclass(frozen=True)
class FeatureData:
    """Inputs of n samples, with the matrix-free maps V ↦ Z V and W ↦ Zᵀ W of their features.

    ``inputs`` (what the kernel baseline sees) is x, (n, d), for ``kind`` ``"hermite"`` and z, (n, D),
    for ``"gaussian"``; ``d`` is the Hermite model's input dimension either way.
    """

    kind: str
    inputs: np.ndarray
    d: int

    @property
    def n(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def dim(self) -> int:
        """D, the feature dimension."""
        return feature_dim(self.d)

    def head(self, n: int) -> "FeatureData":
        """The first ``n`` samples (nested designs share one draw)."""
        return FeatureData(self.kind, self.inputs[:n], self.d)

    def project(self, v: np.ndarray) -> np.ndarray:
        """Z V: (D, k) → (n, k), i.e. ⟨v_j, z(x_μ)⟩ for every sample and column."""
        v = np.asarray(v, dtype=np.float64).reshape(self.dim, -1)
        if self.kind == "gaussian":
            return self.inputs @ v
        mats = vec_to_sym(v, self.d)  # (k, d, d)
        k = mats.shape[0]
        stacked = mats.transpose(1, 0, 2).reshape(self.d, k * self.d)  # [A_1 | ... | A_k]
        out = np.empty((self.n, k))
        for lo in range(0, self.n, _CHUNK):
            xb = self.inputs[lo : lo + _CHUNK]
            xa = (xb @ stacked).reshape(xb.shape[0], k, self.d)
            out[lo : lo + _CHUNK] = np.einsum("nkd,nd->nk", xa, xb)
        return (out - np.trace(mats, axis1=1, axis2=2)) / math.sqrt(2.0)

    def adjoint(self, w: np.ndarray) -> np.ndarray:
        """Zᵀ W: (n, k) → (D, k), i.e. Σ_μ w_μ z(x_μ) for every column of weights."""
        w = np.asarray(w, dtype=np.float64).reshape(self.n, -1)
        if self.kind == "gaussian":
            return self.inputs.T @ w
        k = w.shape[1]
        s = np.zeros((k, self.d, self.d))
        for lo in range(0, self.n, _CHUNK):
            xb = self.inputs[lo : lo + _CHUNK]
            for j in range(k):
                s[j] += xb.T @ (w[lo : lo + _CHUNK, j : j + 1] * xb)
        s -= w.sum(axis=0)[:, None, None] * np.eye(self.d)
        # Σ w z has diagonal coordinates S_ii/√2 and off-diagonal S_ij = sym_to_vec(S)/√2.
        return sym_to_vec(s) / math.sqrt(2.0)


@dataclass(frozen=True)
class HierarchicalTeacher:
    """One draw of the target function: directions ``a`` (D, p), orthonormal; weights ``b`` (p,),
    ±i^(−γ) scaled to Var s = 1 for Gaussian latents; ``y_mean``, ``y_std`` standardise g*(s)."""

    d: int
    gamma: float
    activation: str
    features: str
    a: np.ndarray
    b: np.ndarray
    y_mean: float
    y_std: float

    @property
    def p(self) -> int:
        return int(self.b.shape[0])


def _activation(name: str, s: np.ndarray) -> np.ndarray:
    return np.tanh(s) if name == "tanh" else s


def _rng(seed: int | np.random.SeedSequence) -> np.random.Generator:
    return np.random.default_rng(seed if isinstance(seed, np.random.SeedSequence) else check_seed(seed))


def make_teacher(d: int, *, p: int | None = None, gamma: float = 1.0, eps: float = 0.5, activation: str = "identity",
                 features: str = "hermite", seed: int | np.random.SeedSequence = 0) -> HierarchicalTeacher:
    """Draw the teacher: p (default round(d^eps)) orthonormal a_i ∈ R^D, random signs of b_i, and the
    standardisation constants.

    Raises:
        InvalidOptionError: d < 2, p outside [1, D], gamma ≤ 0, a seed outside [0, 2**32).
        UnknownNameError: an unknown activation or feature kind.
    """
    refuse_unless(is_whole(d) and d >= 2, f"d must be an integer >= 2, not {d!r}")
    refuse_unless(finite_number(eps), f"eps must be a finite number, not {eps!r}")
    big_d = feature_dim(int(d))
    p_used = int(round(d**eps)) if p is None else p
    refuse_unless(is_whole(p_used) and 1 <= p_used <= big_d,
                  f"p must be an integer in [1, {big_d}] for d = {d}, not {p_used!r}")
    refuse_unless(finite_number(gamma) and gamma > 0.0, f"gamma must be a positive number, not {gamma!r}")
    for kind, value, known in (("activation", activation, ACTIVATIONS), ("feature kind", features, FEATURE_KINDS)):
        if value not in known:
            raise unknown_name(kind, value, known)
    rng = _rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((big_d, int(p_used))))
    a = q * np.sign(np.diag(r))  # the Haar-distributed orthonormal frame
    raw = rng.choice([-1.0, 1.0], size=int(p_used)) * np.arange(1, p_used + 1) ** (-float(gamma))
    b = raw / math.sqrt(2.0 * float(np.sum(raw**2)))  # Var Σ b_i(h_i²−1) = 2Σb² = 1
    y_mean, y_std = 0.0, 1.0  # of g*(s); exact for the identity: E s = 0, Var s = 2Σb² = 1
    if activation != "identity":  # Monte Carlo over independent Gaussian latents
        h = np.random.default_rng(_MC_SEED).standard_normal((MC_SAMPLES, b.shape[0]))
        g = _activation(activation, (h * h - 1.0) @ b)
        y_mean, y_std = float(g.mean()), float(g.std())
    return HierarchicalTeacher(int(d), float(gamma), activation, features, a, b, y_mean, y_std)


def sample_data(teacher: HierarchicalTeacher, n: int, *,
                seed: int | np.random.SeedSequence) -> tuple[FeatureData, np.ndarray]:
    """``(data, y)``: n samples of the teacher's inputs (with their feature maps) and standardised outputs.

    Raises:
        InvalidOptionError: n < 1, a seed outside [0, 2**32).
    """
    refuse_unless(is_whole(n) and n >= 1, f"n must be a positive integer, not {n!r}")
    rng = _rng(seed)
    dim = teacher.d if teacher.features == "hermite" else feature_dim(teacher.d)
    data = FeatureData(teacher.features, rng.standard_normal((int(n), dim)), teacher.d)
    h = data.project(teacher.a)  # the latents; y = (g*(s) − E g*)/sd g*
    return data, (_activation(teacher.activation, (h * h - 1.0) @ teacher.b) - teacher.y_mean) / teacher.y_std
