"""How WeightWatcher 0.7.7 turns PyTorch layers into the matrices it analyses (docs/spectral-metrics.md, How
WeightWatcher 0.7.7 builds its matrices, ``intra=True`` included), and how its ``SVDSmoothing`` / ``SVDSharpness`` edit
them, for :mod:`wbfe.editing`'s WeightWatcher-compatible mode (``Conventions.ww_edit``; docs/editing.md)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from wbfe.linalg.spectra import DegenerateMatrixError

__all__ = ["ww_float32", "ww_conv2d_matrices", "ww_conv2d_dims", "ww_linear_matrix", "WW_CONV2D_EIG_SCALE",
           "WW_MIN_EVALS", "WW_MAX_EVALS", "WW_MAX_N", "ww_layer_dims", "ww_skip_reason", "ww_esd_matrices",
           "ww_truncated_smooth", "ww_remove_top", "ww_svd_count", "ww_layer_eigenvalues", "ww_permuted_eigenvalues",
           "ww_slice_count", "ww_edit_matrix", "pooled_eigenvalues", "ww_intra_member_shape", "ww_intra_member"]

#: Factor WeightWatcher 0.7.7 applies to every pooled Conv2d eigenvalue (conv2d_norm with count 1).
WW_CONV2D_EIG_SCALE = 0.5


def ww_linear_matrix(w: np.ndarray) -> np.ndarray:
    """The float64 matrix WeightWatcher 0.7.7 takes the SVD of for a 2-D (out, in) weight: a float32 round trip."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D weight, got shape {w.shape}")
    return w.astype(np.float32).astype(np.float64)


def ww_float32(array: np.ndarray, what: str) -> np.ndarray:
    """``array`` in float32, the precision WeightWatcher computes ``what`` in; DegenerateMatrixError where that cast,
    not the stored values, makes it non-finite or all zero (a finite float64 beyond 3.4e38, or below 1e-45)."""
    with np.errstate(over="ignore", under="ignore"):  # said below, in the terms of the tensor
        out = array.astype(np.float32, copy=False)
    if out.dtype == array.dtype or not np.isfinite(array).all():
        return out
    top = float(np.max(np.abs(array), initial=0.0))
    if not np.isfinite(out).all():
        raise DegenerateMatrixError(f"WeightWatcher's {what} is float32: entries up to {top:.1e} overflow it")
    if top > 0.0 and not out.any():
        raise DegenerateMatrixError(f"WeightWatcher's {what} is float32: entries of at most {top:.1e} are 0 in it")
    return out


def ww_conv2d_matrices(w: np.ndarray, *, pool: bool = True) -> list[np.ndarray]:
    """The float64 matrices (rows >= cols, kh·kw of them) whose squared singular values, pooled, are WeightWatcher
    0.7.7's eigenvalues for a PyTorch Conv2d weight (out, in, kh, kw), scaled as it does (√(1/2), or √(kh·kw/2) each
    with ``pool=False``). Raises ValueError for a weight that is not 4-D."""
    w32 = np.asarray(w)
    if w32.ndim != 4:
        raise ValueError(f"expected a 4-D conv weight (out, in, kh, kw), got shape {w32.shape}")
    w32 = w32.astype(np.float32)  # the precision WeightWatcher computes in
    out_ch, in_ch, kh, kw = w32.shape
    slices = [w32[:, :, i, j].T if out_ch < in_ch else w32[:, :, i, j] for i in range(kh) for j in range(kw)]
    count = 1 if pool else len(slices)
    norm = np.sqrt(count / 2.0)  # a numpy float64, as in WeightWatcher: the product is float64
    return [np.asarray(m * norm, dtype=np.float64) for m in slices]


def ww_conv2d_dims(shape: tuple[int, int, int, int]) -> tuple[int, int, int]:
    """WeightWatcher 0.7.7's reported (N, M, rf) for a PyTorch Conv2d weight of shape (out, in, kh, kw).

    N < M happens (docs/spectral-metrics.md) and changes WW's MP fit: pass these N, M to :func:`wbfe.metrics.mp.mp_fit`
    to reproduce it."""
    out_ch, in_ch, kh, kw = (int(v) for v in shape)
    rf = kh * kw
    if out_ch + in_ch < kh + kw or out_ch >= in_ch:
        return out_ch, in_ch, rf
    return (in_ch, out_ch, rf) if rf % 2 == 1 else (out_ch, in_ch, rf)


# ---------------------------------------------------------------- SVDSmoothing / SVDSharpness

#: WeightWatcher 0.7.7's ``DEFAULT_MIN_EVALS``, ``DEFAULT_MAX_EVALS`` and ``DEFAULT_MAX_N``.
WW_MIN_EVALS, WW_MAX_EVALS, WW_MAX_N = 8, 15000, 50000


def ww_layer_dims(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """WeightWatcher 0.7.7's (N, M, rf) of a 2-D weight or a PyTorch Conv2d weight (out, in, kh, kw)."""
    if len(shape) == 2:
        return max(shape), min(shape), 1
    return ww_conv2d_dims((shape[0], shape[1], shape[2], shape[3]))


def ww_skip_reason(shape: tuple[int, ...]) -> Optional[str]:
    """Why WeightWatcher 0.7.7 does not analyse (so neither smooths nor sharpens) a weight of this
    shape, None when it does."""
    n, m, rf = ww_layer_dims(shape)
    if len(shape) == 4 and shape[0] + shape[1] < shape[2] + shape[3]:
        return "WeightWatcher reads this kernel channels-first (out + in < kh + kw); not reproduced"
    if m * rf < WW_MIN_EVALS:
        return f"WeightWatcher skips it: {m * rf} eigenvalues < min_evals {WW_MIN_EVALS}"
    if m * rf > WW_MAX_EVALS:
        return f"WeightWatcher skips it: {m * rf} eigenvalues > max_evals {WW_MAX_EVALS}"
    if n > WW_MAX_N:
        return f"WeightWatcher skips it: N = {n} > max_N {WW_MAX_N}"
    return None


def ww_esd_matrices(w32: np.ndarray) -> list[np.ndarray]:
    """The matrices whose pooled eigenvalues are WeightWatcher's spectrum of the layer (float64)."""
    if w32.ndim == 2:
        return [ww_linear_matrix(w32)]
    return ww_conv2d_matrices(w32)


def pooled_eigenvalues(mats: list[np.ndarray]) -> np.ndarray:
    """The squared singular values of all ``mats`` together, sorted."""
    return np.sort(np.concatenate([np.linalg.svd(m, compute_uv=False) ** 2 for m in mats]))


def ww_truncated_smooth(w: np.ndarray, k: int) -> np.ndarray:
    """``RMT_Util._smooth_W_accurate(w, k)``: scikit-learn's ``TruncatedSVD(k, n_iter=7, random_state=42)`` projection
    of ``w`` on its k leading right singular vectors, step by step, in ``w``'s own precision. ValueError for k > the
    smaller side (scikit-learn refuses it, and so WeightWatcher fails)."""
    import scipy.linalg

    x = w.T if w.shape[0] < w.shape[1] else w
    if not 1 <= k <= x.shape[1]:
        raise ValueError(f"n_components {k} outside [1, {x.shape[1]}]")
    # _randomized_range_finder: a seeded Gaussian start, 7 LU-normalised power iterations, one QR
    q = np.random.RandomState(42).normal(size=(x.shape[1], k + 10))  # n_oversamples = 10
    if x.dtype == np.float32:
        q = q.astype(np.float32, copy=False)
    for _ in range(7):
        q = scipy.linalg.lu(x @ q, permute_l=True, check_finite=False)[0]
        q = scipy.linalg.lu(x.T @ q, permute_l=True, check_finite=False)[0]
    q = scipy.linalg.qr(x @ q, mode="economic", check_finite=False)[0]
    vt = scipy.linalg.svd(q.T @ x, full_matrices=False, lapack_driver="gesdd")[2][:k]
    # TruncatedSVD.fit_transform is X·Vᵀ; the sign flip of V cancels in X·Vᵀ·V, so it is left out
    smoothed = (x @ vt.T) @ vt
    return smoothed.T if x is not w else smoothed


def ww_remove_top(w: np.ndarray, count: int) -> np.ndarray:
    """``WeightWatcher.smooth_W_alt(w, -count)``: the full SVD with the ``count`` largest singular
    values zeroed, recomposed as WeightWatcher recomposes it."""
    import scipy.linalg

    n, m = max(w.shape), min(w.shape)
    u, s, vh = scipy.linalg.svd(w, compute_uv=True)
    s[:count] = 0.0
    full = np.diag(np.array(list(s) + [0] * (n - m)))  # WW's list round trip decides the dtype
    if u.shape[0] > vh.shape[0]:
        return np.asarray(np.dot(np.dot(u, full)[:n, :m], vh))
    return np.asarray(np.dot(u, np.dot(full, vh)[:m, :n]))


def ww_svd_count(shape: tuple[int, ...], percent: float) -> int:
    """SVDSmoothing's ``num_smooth`` with method ``svd``: ``int(percent·M·rf)``, WW's M and rf."""
    _, m, rf = ww_layer_dims(shape)
    return int(percent * m * rf)


def ww_layer_eigenvalues(w32: np.ndarray) -> np.ndarray:
    """The layer's pooled, sorted spectrum as WW's ``apply_esd`` makes it (detX counts on it)."""
    return pooled_eigenvalues(ww_esd_matrices(w32))


def ww_permuted_eigenvalues(w32: np.ndarray, generator: np.random.RandomState) -> np.ndarray:
    """SVDSharpness's spectrum: WW's matrices of the layer (float32 weight), each permuted (``permute_matrix``) by one
    draw of ``generator``, which stands for NumPy's global generator."""
    return pooled_eigenvalues([mat.reshape(-1)[generator.permutation(np.arange(mat.size))].reshape(mat.shape)
                               for mat in ww_esd_matrices(w32)])


def ww_slice_count(shape: tuple[int, ...], num_smooth: int) -> int:
    """SVDSmoothing's count per matrix: ``num_smooth``, divided as ⌈num_smooth/rf⌉ per slice ``w[:, :, i, j]`` of a
    Conv2d."""
    return math.ceil(num_smooth / math.prod(shape[2:]))


def ww_edit_matrix(mat: np.ndarray, count: int) -> np.ndarray:
    """``apply_svd_smoothing`` of one matrix: keep ``count`` > 0 components, remove −``count`` < 0. ValueError for a
    count larger than its smaller side (WeightWatcher fails on it too)."""
    return ww_truncated_smooth(mat, count) if count > 0 else ww_remove_top(mat, -count)


# ---------------------------------------------------------------- intra=True

def ww_intra_member_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The shape of the matrix a Conv2d weight (out, in, kh, kw) enters WW's intra chain with."""
    out_ch, in_ch = int(shape[0]), int(shape[1])
    return (in_ch, out_ch) if out_ch < in_ch else (out_ch, in_ch)


def ww_intra_member(shape: tuple[int, ...], matrices: list[np.ndarray]) -> tuple[np.ndarray, int, float]:
    """A Conv2d's member of WW's intra chain: (its first slice, the count a product with it second keeps, the factor
    such a product is scaled by). The first of its ``ww_conv2d_matrices`` is unscaled back to the float32 slice exactly
    (the scaled float64 product rounds back to it)."""
    first = (np.asarray(matrices[0], dtype=np.float64) / np.sqrt(0.5)).astype(np.float32).astype(np.float64)
    _, m, rf = ww_conv2d_dims((shape[0], shape[1], shape[2], shape[3]))
    return first, m * rf, float(np.sqrt(0.5))
