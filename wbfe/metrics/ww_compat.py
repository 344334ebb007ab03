"""How WeightWatcher 0.7.7 turns PyTorch layers into the matrices whose eigenvalues it analyses.

Read from ``weightwatcher/weightwatcher.py`` (``PyTorchLayer``, ``WWLayer.set_weight_matrices``,
``conv2D_Wmats``, ``apply_normalize_Wmats``, ``combined_eigenvalues``, ``fit_powerlaw``) with the
default ``analyze()`` options (``pool=True``, ``conv2d_norm=True``, ``glorot_fix=False``,
``svd_method='fast'``, ``min_evals=8``, ``max_evals=15000``, ``max_N=50000``), on a CPU machine.

All layers:
    - the weight is read as ``tensor.float().numpy()``: rounded to float32 whatever its dtype;
      each matrix is cast to float64 just before ``scipy.linalg.svd`` (on CPU; with CUDA, WW uses
      torch ``svdvals`` and returns float32 singular values);
    - eigenvalues = squared singular values: the min(rows, cols) eigenvalues of the smaller Gram
      matrix, zeros included; they are pooled and sorted for the layer;
    - a layer is skipped when its number of pooled eigenvalues M·rf (rf = 1 for Linear) is below
      ``min_evals`` (8) or above ``max_evals`` (15000, so e.g. a 3×3 conv with 2048 channels is
      skipped), or when N > ``max_N`` (50000); biases are ignored;
    - the power-law fit uses only eigenvalues > 1e-5 (absolute, ``EVALS_THRESH``); zeros and
      small values are kept for norm, spectral norm, stable rank, rank, entropy and the MP fit.

Linear (and Embedding, Conv1d): the stored (out, in) matrix, not transposed (the singular values do
not depend on it), no rescaling. N = max(out, in), M = min(out, in), Q = N/M.

Conv2d, weight (out, in, kh, kw):
    - one matrix per kernel position, ``w[:, :, i, j]`` for i in range(kh), j in range(kw)
      (row-major), transposed when out < in so that rows >= cols. WW labels the tensor "channels
      first" when out + in < kh + kw (tiny channel counts, large kernels), warns, and for a PyTorch
      model ends up with the very same slices (only a Keras tensor is sliced ``w[i, j, :, :]``).
    - every slice is multiplied by √(conv2d_count/2) with conv2d_count = 1 in the default pooled
      mode: W·(1/√2), i.e. every eigenvalue is halved (the hidden ×0.5). With ``pool=False``
      each slice is its own row and is multiplied by √(kh·kw/2) instead (eigenvalues × kh·kw/2).
      The product is float32 slice × numpy float64 scalar, i.e. float64 under numpy >= 2.
    - the layer has min(out, in)·kh·kw pooled eigenvalues; rf = kh·kw. WW's reported N, M (used for
      Q = N/M in its MP fit and for the rank tolerance) are *not* always max/min of a slice: N, M are
      swapped once per transposed slice, so for out < in they end as (in, out) when kh·kw is odd
      but (out, in), i.e. N < M, when kh·kw is even; in the "channels first" case they are
      (out, in). :func:`ww_conv2d_dims` reproduces this; eigenvalues and α are unaffected.

SVDSmoothing / SVDSharpness (``WeightWatcher.SVDSmoothing``, ``apply_svd_smoothing``,
``smooth_W_alt``, ``SVDSharpness``, ``apply_svd_sharpness``; ``RMT_Util._smooth_W_accurate``,
``permute_matrix``), for :mod:`wbfe.editing`'s WeightWatcher-compatible mode (``Conventions.ww_edit``):
    - the edited layers are the analysed ones (the skip rules above), the weight read as float32;
    - the count: ``svd`` ``int(percent·M·rf)`` with WW's M (a Conv2d's from :func:`ww_conv2d_dims`),
      ``detX`` the ``detX_num`` of the layer's pooled spectrum; sharpening −(the MP spikes of the
      spectrum of the layer's matrices, each permuted by ``np.random.permutation`` from NumPy's
      global generator). A Conv2d divides it over its slices ``w[:, :, i, j]``, ⌈count/rf⌉;
    - a positive count k keeps k components with scikit-learn's ``TruncatedSVD(n_components=k,
      n_iter=7, random_state=42)`` (randomised, LU-normalised power iterations; imported by
      ``RMT_Util``, and the CPU "fast" method is this one too): the weight (rows ≥ cols, transposed
      if need be) projected on the k right vectors it finds, X·Vₖ·Vₖᵀ, in float32;
      :func:`ww_truncated_smooth` is that algorithm step by step (scikit-learn 1.x's
      ``_randomized_range_finder`` and ``_randomized_svd``), on SciPy, which wbfe depends on;
    - a negative count −c: the full SVD (``scipy.linalg.svd``) with the c largest singular values
      set to 0, recomposed (:func:`ww_remove_top`); 0 leaves the weight as it is.

``intra=True`` (``WWIntraLayerIterator``) on a conv net: the chain is every analysed layer in
module order, Conv2d included; each layer enters with ``Wmats[0]``, which for a Conv2d is its
first kernel position's slice ``w[:, :, 0, 0]``, transposed when out < in, not yet scaled (the
conv normalisation runs later, in ``analyze``'s loop). The product row is a copy of the *second*
layer: it keeps that layer's ``num_components`` (M·rf for a Conv2d, with WW's M) largest values,
and ``apply_normalize_Wmats`` scales the product by √(1/2) when that layer is a Conv2d.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from wbfe.linalg.conv_fft import FFT_GRID, conv2d_fft_eigenvalues

__all__ = ["WW_EVALS_THRESH", "ww_conv2d_matrices", "ww_conv2d_dims", "ww_linear_matrix", "ww_conv2d_fft_eigenvalues",
           "WW_CONV2D_EIG_SCALE", "WW_FFT_GRID", "WW_MIN_EVALS", "WW_MAX_EVALS", "WW_MAX_N", "ww_layer_dims",
           "ww_skip_reason", "ww_esd_matrices", "ww_truncated_smooth", "ww_remove_top", "ww_svd_count",
           "ww_layer_eigenvalues", "ww_permuted_eigenvalues", "ww_edit_weight", "ww_intra_member_shape", "ww_intra_member"]

#: WeightWatcher 0.7.7 drops eigenvalues at or below this before its power-law fit (``EVALS_THRESH``).
WW_EVALS_THRESH = 1e-5
#: The FFT grid of WeightWatcher 0.7.7's ``conv2d_fft``; the FFT view itself lives in the public
#: :mod:`wbfe.linalg.conv_fft` (the engine scores it for ``--conv fft``), named here as before.
WW_FFT_GRID = FFT_GRID
ww_conv2d_fft_eigenvalues = conv2d_fft_eigenvalues

#: Factor WeightWatcher 0.7.7 applies to every pooled Conv2d eigenvalue (conv2d_norm with count 1).
WW_CONV2D_EIG_SCALE = 0.5


def ww_linear_matrix(w: np.ndarray) -> np.ndarray:
    """The matrix WeightWatcher 0.7.7 takes the SVD of for a Linear/Embedding/Conv1d weight.

    Args:
        w: the 2-D weight as stored, (out, in).

    Returns:
        float64 copy of ``w`` after a float32 round trip (orientation unchanged).

    Raises:
        ValueError: ``w`` is not 2-D.
    """
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D weight, got shape {w.shape}")
    return w.astype(np.float32).astype(np.float64)


def ww_conv2d_matrices(w: np.ndarray, *, pool: bool = True) -> list[np.ndarray]:
    """The matrices WeightWatcher 0.7.7 pools the eigenvalues of for a PyTorch Conv2d weight.

    Args:
        w: weight of shape (out, in, kh, kw), as ``torch.nn.Conv2d.weight``.
        pool: WeightWatcher's ``pool`` option (default True: one row per layer); with False each
            slice is its own row and is scaled by √(kh·kw/2) instead of √(1/2).

    Returns:
        float64 matrices (rows >= cols), kh·kw of them, scaled exactly as WeightWatcher does;
        their squared singular values, pooled, are WeightWatcher's eigenvalues for the layer.

    Raises:
        ValueError: ``w`` is not 4-D.
    """
    w32 = _conv_weight32(w)
    out_ch, in_ch, kh, kw = w32.shape
    slices: list[np.ndarray] = []
    for i in range(kh):
        for j in range(kw):
            m = w32[:, :, i, j]
            slices.append(m.T if out_ch < in_ch else m)
    count = 1 if pool else len(slices)
    norm = np.sqrt(count / 2.0)  # a numpy float64, as in WeightWatcher: the product is float64
    return [np.asarray(m * norm, dtype=np.float64) for m in slices]


def ww_conv2d_dims(shape: tuple[int, int, int, int]) -> tuple[int, int, int]:
    """WeightWatcher 0.7.7's reported (N, M, rf) for a PyTorch Conv2d weight of this shape.

    Args:
        shape: (out, in, kh, kw).

    Returns:
        ``(N, M, rf)``; N < M happens (see the module docstring) and changes WW's MP fit
        (pass these N, M to :func:`wbfe.metrics.mp.mp_fit` to reproduce it).
    """
    out_ch, in_ch, kh, kw = (int(v) for v in shape)
    rf = kh * kw
    if out_ch + in_ch < kh + kw or out_ch >= in_ch:
        return out_ch, in_ch, rf
    return (in_ch, out_ch, rf) if rf % 2 == 1 else (out_ch, in_ch, rf)


def _conv_weight32(w: Any) -> np.ndarray:
    """A conv weight (out, in, kh, kw) as float32, the precision WeightWatcher computes in.

    Raises:
        ValueError: ``w`` is not 4-D.
    """
    w = np.asarray(w)
    if w.ndim != 4:
        raise ValueError(f"expected a 4-D conv weight (out, in, kh, kw), got shape {w.shape}")
    return w.astype(np.float32)


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


def _pooled(mats: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate([np.linalg.svd(m, compute_uv=False) ** 2 for m in mats]))


def ww_truncated_smooth(w: np.ndarray, k: int) -> np.ndarray:
    """``RMT_Util._smooth_W_accurate(w, k)``: scikit-learn's ``TruncatedSVD(k, n_iter=7,
    random_state=42)`` projection of ``w`` on its k leading right singular vectors, step by step.

    In ``w``'s own precision (float32 as WeightWatcher reads a layer), as scikit-learn computes.

    Raises:
        ValueError: k > the smaller side (scikit-learn refuses it, and so WeightWatcher fails).
    """
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
    return _pooled(ww_esd_matrices(w32))


def ww_permuted_eigenvalues(w32: np.ndarray, generator: np.random.RandomState) -> np.ndarray:
    """SVDSharpness's spectrum: WW's matrices of the layer, each permuted (``permute_matrix``).

    Args:
        w32: the weight as WeightWatcher reads it (float32).
        generator: stands for NumPy's global generator, which WeightWatcher permutes with; one
            permutation per matrix is drawn from it, as WeightWatcher draws them.
    """
    permuted = []
    for mat in ww_esd_matrices(w32):
        ids = generator.permutation(np.arange(mat.size))
        permuted.append(mat.reshape(-1)[ids].reshape(mat.shape))
    return _pooled(permuted)


def ww_edit_weight(w32: np.ndarray, num_smooth: int) -> np.ndarray:
    """``apply_svd_smoothing`` of one weight: keep ``num_smooth`` > 0 components, remove −``num_smooth``
    < 0, per slice ``w[:, :, i, j]`` of a Conv2d with the count divided, ⌈num_smooth/rf⌉.

    Raises:
        ValueError: a count larger than a matrix's smaller side (WeightWatcher fails on it too).
    """
    def one(mat: np.ndarray, count: int) -> np.ndarray:
        if count > 0:
            return ww_truncated_smooth(mat, count)
        return ww_remove_top(mat, -count) if count < 0 else mat

    if w32.ndim == 2:
        return one(w32, num_smooth)
    _, _, kh, kw = w32.shape
    count = int(math.ceil(num_smooth / (kh * kw)))
    out = np.zeros_like(w32)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i, j] = one(w32[:, :, i, j], count)
    return out


# ---------------------------------------------------------------- intra=True

def ww_intra_member_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The shape of the matrix a Conv2d weight (out, in, kh, kw) enters WW's intra chain with."""
    out_ch, in_ch = int(shape[0]), int(shape[1])
    return (in_ch, out_ch) if out_ch < in_ch else (out_ch, in_ch)


def ww_intra_member(shape: tuple[int, ...], matrices: list[np.ndarray]) -> tuple[np.ndarray, int, float]:
    """A Conv2d's member of WW's intra chain: (its first slice, the count a product with it second
    keeps, the factor such a product is scaled by).

    Args:
        shape: the weight's shape (out, in, kh, kw).
        matrices: :func:`ww_conv2d_matrices` of it (scaled by √(1/2)); the first is unscaled
            back to the float32 slice exactly (the scaled float64 product rounds back to it).
    """
    first = (np.asarray(matrices[0], dtype=np.float64) / np.sqrt(0.5)).astype(np.float32).astype(np.float64)
    _, m, rf = ww_conv2d_dims((shape[0], shape[1], shape[2], shape[3]))
    return first, m * rf, float(np.sqrt(0.5))
