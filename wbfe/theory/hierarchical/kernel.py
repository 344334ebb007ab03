"""The shallow baseline of docs/math.md §7: kernel ridge regression on the raw inputs, its ridge chosen among a
fixed grid by exact leave-one-out error (closed-form given one eigendecomposition of the kernel matrix)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wbfe.theory.checks import is_number, refuse_unless

__all__ = ["RIDGE_GRID", "KernelFit", "rbf_kernel", "fit_kernel_ridge", "predict_kernel_ridge"]

RIDGE_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)


def rbf_kernel(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Gaussian kernel matrix exp(−‖u_i − v_j‖²/(2·dim)) between the rows of u and v."""
    sq = np.sum(u * u, axis=1)[:, None] + np.sum(v * v, axis=1)[None, :] - 2.0 * (u @ v.T)
    return np.exp(-np.maximum(sq, 0.0) / (2.0 * u.shape[1]))


@dataclass(frozen=True)
class KernelFit:
    """A fitted kernel ridge regressor: dual ``coef`` on the centred outputs, whose mean is ``intercept``,
    and the ridge chosen by leave-one-out with its error ``loo_mse``."""

    train_inputs: np.ndarray
    coef: np.ndarray
    intercept: float
    ridge: float
    loo_mse: float


def fit_kernel_ridge(inputs: np.ndarray, y: np.ndarray, *, ridges: tuple[float, ...] = RIDGE_GRID) -> KernelFit:
    """Kernel ridge regression on (n, dim) inputs with the ridge picked by exact leave-one-out error among
    ``ridges``, relative to n (the penalty is ridge·n·‖f‖²_K / n).

    Raises:
        InvalidOptionError: shapes do not match, non-finite values, or a ridge that is not a positive number.
    """
    inputs, y = np.asarray(inputs, dtype=np.float64), np.asarray(y, dtype=np.float64)
    refuse_unless(inputs.ndim == 2 and y.shape == (inputs.shape[0],) and inputs.shape[0] >= 2,
                  "kernel ridge needs inputs (n, dim) and y (n,) with n >= 2")
    # eigh's LinAlgError, or a NaN fit
    refuse_unless(np.all(np.isfinite(inputs)) and np.all(np.isfinite(y)), "kernel ridge needs finite inputs and y")
    refuse_unless(np.ndim(ridges) == 1 and len(ridges) and all(is_number(r) and r > 0.0 for r in ridges),
                  f"ridges must be a non-empty list of positive numbers, not {ridges!r}")
    n = inputs.shape[0]
    intercept = float(y.mean())
    yc = y - intercept
    evals, evecs = np.linalg.eigh(rbf_kernel(inputs, inputs))
    evals = np.maximum(evals, 0.0)
    proj = evecs.T @ yc

    def loo(ridge: float) -> float:
        shrink = evals / (evals + ridge * n)  # eigenvalues of the hat matrix
        hat_diag = np.einsum("ij,j,ij->i", evecs, shrink, evecs)
        return float(np.mean(((yc - evecs @ (shrink * proj)) / (1.0 - hat_diag)) ** 2))

    errors = {float(ridge): loo(ridge) for ridge in ridges}
    best = min(errors, key=errors.__getitem__)  # the first of equal errors
    return KernelFit(inputs, evecs @ (proj / (evals + best * n)), intercept, best, errors[best])


def predict_kernel_ridge(fit: KernelFit, inputs: np.ndarray) -> np.ndarray:
    """Predictions of a fitted kernel ridge regressor at new inputs, shape (m,)."""
    out = np.empty(inputs.shape[0])
    for lo in range(0, inputs.shape[0], 4096):  # bounds the m×n kernel block
        out[lo : lo + 4096] = rbf_kernel(inputs[lo : lo + 4096], fit.train_inputs) @ fit.coef
    return out + fit.intercept
