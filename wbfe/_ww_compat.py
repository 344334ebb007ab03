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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wbfe.conv_fft import FFT_GRID, conv2d_fft_eigenvalues

__all__ = ["WW_EVALS_THRESH", "ww_conv2d_matrices", "ww_conv2d_dims", "ww_linear_matrix", "ww_conv2d_fft_eigenvalues",
           "WW_CONV2D_EIG_SCALE", "WW_FFT_GRID"]

#: WeightWatcher 0.7.7 drops eigenvalues at or below this before its power-law fit (``EVALS_THRESH``).
WW_EVALS_THRESH = 1e-5
#: The FFT grid of WeightWatcher 0.7.7's ``conv2d_fft``; the FFT view itself lives in the public
#: :mod:`wbfe.conv_fft` (the engine scores it for ``--conv fft``), named here as before.
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
