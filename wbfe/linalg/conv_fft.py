"""The FFT view of a conv kernel (WeightWatcher 0.7.7's ``conv2d_fft=True``): what ``--conv fft`` scores.

Not the spectrum of the convolution operator (WeightWatcher marks the option deprecated): reproduced so that its numbers
can be compared, step by step as docs/metrics.md ("The FFT view of conv kernels") has it."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["FFT_GRID", "conv2d_fft_dims", "conv2d_fft_eigenvalues"]

#: The FFT grid of WeightWatcher 0.7.7's ``conv2d_fft`` (``get_conv2d_fft(W, n=32)``).
FFT_GRID = 32


def conv2d_fft_dims(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(N, M, kept)`` of the FFT view of a kernel of this (out, in, kh, kw) shape: the sides N ≥ M
    WeightWatcher reports and the number rf·N·M of eigenvalues it keeps; ValueError where ``shape`` is not 4-D."""
    if len(shape) != 4:
        raise ValueError(f"expected a 4-D conv weight (out, in, kh, kw), got shape {tuple(shape)}")
    n, m, imax, jmax = (int(v) for v in shape)
    if n + m < imax + jmax:
        n, m, imax, jmax = imax, jmax, n, m
    n, m = max(n, m), min(n, m)
    return n, m, min(imax, jmax) * n * m


def conv2d_fft_eigenvalues(w: Any) -> tuple[np.ndarray, int, int]:
    """``(eigenvalues ascending, N, M)`` as WeightWatcher 0.7.7 analyses a Conv2d weight (out, in, kh, kw)
    with ``conv2d_fft=True``, read as float32, the precision it computes in; ValueError where ``w`` is not 4-D."""
    w32 = np.asarray(w)
    n, m, kept = conv2d_fft_dims(w32.shape)
    w32 = w32.astype(np.float32)
    out_ch, in_ch, kh, kw = w32.shape
    axes = [2, 3] if out_ch + in_ch >= kh + kw else [0, 1]
    coefs = np.fft.fft2(w32, [FFT_GRID, FFT_GRID], axes=axes) * np.sqrt(1 / 2.0)
    sv = np.sort(np.linalg.svd(coefs.real.astype(np.float64), compute_uv=False).ravel())[-kept:]
    return sv * sv, n, m  # squares of sorted non-negative values are sorted
