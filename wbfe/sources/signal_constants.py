"""Signal-processing constants (an STFT/DFT basis, a window, a mel filterbank): never learned, so never scored,
whichever reader finds them: by name (:func:`signal_name`) or, shaped like one, by value (:func:`is_dft_basis`)."""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional

import numpy as np

__all__ = ["signal_name", "name_reason", "DFT_REASON", "dft_shaped", "is_dft_basis"]

_SIGNAL = re.compile(r"(?<![a-z])(i?stft|i?r?dft|i?r?fft|mel_?filters?|mel_?basis|mel_?fb|filterbanks?|fbank|"
                     r"(forward|inverse)_basis|(hann|hamming|blackman|kaiser)_window)(?![a-z])", re.I)

DFT_REASON = ("signal-processing constant (a windowed DFT basis: the graph computes a short-time "
              "Fourier transform with it), not a learned weight")


def signal_name(names: Iterable[str]) -> Optional[str]:
    """The first part of any of ``names`` that names a signal-processing constant, or None."""
    return next((m.group(0) for m in (_SIGNAL.search(n) for n in names) if m), None)


def name_reason(found: str) -> str:
    """The skip reason for a tensor whose name (or consumer's) contains ``found``."""
    return (f"signal-processing constant ({found}: an STFT/DFT basis, window or filterbank "
            f"the graph computes with), not a learned weight")


def dft_shaped(shape: tuple[int, ...]) -> bool:
    """out × n (a MatMul/Gemm) or out × 1 × n (a Conv1d over one channel), with out = n/2+1 or twice it."""
    if len(shape) not in (2, 3) or (len(shape) == 3 and shape[1] != 1):
        return False
    rows, n = shape[0], shape[-1]
    return n >= 8 and rows in (n // 2 + 1, 2 * (n // 2 + 1))


def is_dft_basis(matrix: Any) -> bool:
    """Whether ``matrix`` (out × [1 ×] n) is a windowed real DFT basis as STFT exports store it, to a relative
    tolerance of 1e-3: rows ``w[t]·cos(2πkt/n)`` for k = 0..n/2, then (with twice as many rows)
    ``±w[t]·sin(2πkt/n)``, the window ``w`` being row 0."""
    m = np.asarray(matrix, dtype=np.float64).reshape(matrix.shape[0], -1)
    rows, n = m.shape
    bins = n // 2 + 1
    window = m[0]
    scale = float(np.abs(window).max()) if window.size else 0.0
    if scale == 0.0 or not np.isfinite(scale) or np.count_nonzero(np.abs(window) > 1e-6 * scale) < n // 2:
        return False
    angle = 2 * np.pi * np.outer(np.arange(bins), np.arange(n)) / n
    tol = 1e-3 * scale
    if not np.allclose(m[:bins], window * np.cos(angle), rtol=0, atol=tol):
        return False
    return rows == bins or any(np.allclose(m[bins:], sign * window * np.sin(angle), rtol=0, atol=tol)
                               for sign in (1, -1))
