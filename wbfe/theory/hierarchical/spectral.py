"""The layer-wise spectral learner of docs/math.md §7 and the overlaps with the teacher.

Ĉ is applied matrix-free (two passes over the n×d inputs per product), so memory is O(n·d + D·p).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wbfe.errors import InvalidOptionError, unknown_name
from wbfe.theory.hierarchical.model import FeatureData, hermite_features
from wbfe.theory.checks import check_seed, finite_number, is_whole, refuse_unless

if TYPE_CHECKING:
    from scipy.sparse.linalg import LinearOperator

__all__ = ["SOLVERS", "SpectralFit", "moment_operator", "dense_moment_matrix", "top_eigenpairs", "fit_spectral",
           "predict_spectral", "matched_overlaps"]

SOLVERS = ("auto", "eigsh", "dense")
DENSE_MAX_DIM = 1500  # "auto" builds Ĉ explicitly up to this D (18 MB); beyond, Lanczos
_DENSE_CHUNK = 4096


def moment_operator(data: FeatureData, y: np.ndarray) -> "LinearOperator":
    """Ĉ = (1/n) Σ y_μ (z_μ z_μᵀ − I) as a symmetric matrix-free LinearOperator on R^D."""
    from scipy.sparse.linalg import LinearOperator

    y = np.asarray(y, dtype=np.float64)
    n, mean_y = data.n, float(np.mean(y))

    def matmat(v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64).reshape(data.dim, -1)
        return data.adjoint(y[:, None] * data.project(v)) / n - mean_y * v

    return LinearOperator((data.dim, data.dim), matvec=matmat, matmat=matmat, rmatvec=matmat, dtype=np.float64)


def dense_moment_matrix(data: FeatureData, y: np.ndarray) -> np.ndarray:
    """Ĉ built explicitly (D×D, O(n·D²) time): the independent path for small d."""
    y = np.asarray(y, dtype=np.float64)
    out = np.zeros((data.dim, data.dim))
    for lo in range(0, data.n, _DENSE_CHUNK):
        block = data.inputs[lo : lo + _DENSE_CHUNK]
        z = hermite_features(block) if data.kind == "hermite" else block
        out += z.T @ (y[lo : lo + _DENSE_CHUNK, None] * z)
    out /= data.n
    out[np.diag_indices_from(out)] -= float(np.mean(y))
    return out


def top_eigenpairs(data: FeatureData, y: np.ndarray, k: int, *, solver: str = "auto", seed: int = 0,
                   tol: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """``(values, vectors)``, (k,) and (D, k): the k eigenpairs of Ĉ of largest |eigenvalue|, by
    |eigenvalue| descending.

    Args:
        k: 1 ≤ k < D for ``eigsh``, ≤ D for ``dense``.
        solver: ``"eigsh"`` (Lanczos on the matrix-free operator), ``"dense"`` (explicit Ĉ), or
            ``"auto"`` (dense when D <= DENSE_MAX_DIM).
        seed: seed of the Lanczos start vector (the result is deterministic given it).
        tol: relative accuracy asked of ARPACK (0: machine precision).

    Raises:
        InvalidOptionError: k out of range, a tol that is not a finite number >= 0, a seed outside [0, 2**32).
        UnknownNameError: unknown solver.
    """
    if solver not in SOLVERS:
        raise unknown_name("eigensolver", solver, SOLVERS)
    if solver == "auto":
        # One O(n·D²) pass beats the hundreds of O(n·D) products Lanczos needs on a clustered bulk.
        solver = "dense" if data.dim <= DENSE_MAX_DIM else "eigsh"
    # Checked for every solver, so that a bad value is refused before the run that would reach ARPACK.
    refuse_unless(finite_number(tol) and tol >= 0, f"tol must be a finite number >= 0, not {tol!r}")
    seed = check_seed(seed)
    limit = data.dim if solver == "dense" else data.dim - 1
    refuse_unless(is_whole(k) and 1 <= k <= limit,
                  f"k must be an integer in [1, {limit}] for solver {solver!r}, not {k!r}")
    if solver == "dense":
        vals, vecs = np.linalg.eigh(dense_moment_matrix(data, y))
    else:
        from scipy.sparse.linalg import eigsh

        v0 = np.random.default_rng(seed).standard_normal(data.dim)
        ncv = min(data.dim, max(2 * k + 1, k + 20))
        vals, vecs = eigsh(moment_operator(data, y), k=int(k), which="LM", v0=v0, ncv=ncv, tol=tol)
    order = np.argsort(-np.abs(vals), kind="stable")[: int(k)]
    return vals[order], vecs[:, order]


@dataclass(frozen=True)
class SpectralFit:
    """The learned two-layer predictor: directions â_i (D, k) with their eigenvalues of Ĉ, B̂ (k, k) and
    the affine calibration c₀, c₁."""

    eigenvalues: np.ndarray
    directions: np.ndarray
    second_layer: np.ndarray
    intercept: float
    slope: float


def _raw_output(h_hat: np.ndarray, second_layer: np.ndarray) -> np.ndarray:
    return np.einsum("ni,ij,nj->n", h_hat, second_layer, h_hat) - float(np.trace(second_layer))


def fit_spectral(data: FeatureData, y: np.ndarray, k: int, *, solver: str = "auto", seed: int = 0,
                 tol: float = 1e-6) -> SpectralFit:
    """Train the layer-wise spectral learner on (data, y), keeping k directions (``solver``, ``seed`` and
    ``tol`` as in :func:`top_eigenpairs`).

    Raises:
        InvalidOptionError: y does not match the data, k out of range, or a bad tol or seed.
    """
    y = np.asarray(y, dtype=np.float64)
    refuse_unless(y.shape == (data.n,), f"y must have shape ({data.n},), not {y.shape}")
    if not np.all(np.isfinite(y)):  # eigh's LinAlgError otherwise
        raise InvalidOptionError(f"y must be finite; it has {np.count_nonzero(~np.isfinite(y))} inf/NaN values")
    vals, vecs = top_eigenpairs(data, y, k, solver=solver, seed=seed, tol=tol)
    h_hat = data.project(vecs)
    second = (h_hat.T @ (y[:, None] * h_hat) - float(np.sum(y)) * np.eye(vecs.shape[1])) / (2.0 * data.n)
    raw = _raw_output(h_hat, second)
    var_raw = float(np.var(raw))
    # A constant raw output (no usable direction) calibrates to the mean: slope 0, not a division by 0.
    slope = float(np.mean((raw - raw.mean()) * (y - y.mean())) / var_raw) if var_raw > 0.0 else 0.0
    intercept = float(y.mean() - slope * raw.mean())
    return SpectralFit(vals, vecs, second, intercept, slope)


def predict_spectral(fit: SpectralFit, data: FeatureData) -> np.ndarray:
    """Predictions of a fitted spectral learner on new inputs, shape (n,)."""
    h_hat = data.project(fit.directions)
    return fit.intercept + fit.slope * _raw_output(h_hat, fit.second_layer)


def matched_overlaps(teacher_dirs: np.ndarray, learned_dirs: np.ndarray) -> np.ndarray:
    """Squared cosines q_i = ⟨a_i, â_π(i)⟩² ∈ [0, 1] of the (D, p) teacher directions under the one-to-one
    matching π to the (D, k) learned ones that maximises Σ q; one left unmatched (k < p) gets 0."""
    from scipy.optimize import linear_sum_assignment

    cos2 = (np.asarray(teacher_dirs).T @ np.asarray(learned_dirs)) ** 2
    rows, cols = linear_sum_assignment(cos2, maximize=True)
    q = np.zeros(cos2.shape[0])
    q[rows] = cos2[rows, cols]
    return np.clip(q, 0.0, 1.0)
