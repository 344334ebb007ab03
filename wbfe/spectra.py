"""The only place eigenvalues are computed: smaller Gram matrix, float64, once per matrix.

The Gram matrix is accumulated block by block in float64, so a bfloat16 tensor never exists as a
whole float64 copy: peak extra memory is one block plus the p×p Gram matrix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Sequence

import numpy as np

from wbfe.errors import InvalidOptionError, WbfeError
from wbfe.metrics._group import Spectrum

if TYPE_CHECKING:
    import torch

__all__ = ["DegenerateMatrixError", "resolve_device", "gram", "eigenvalues", "spectrum"]

Device = Literal["auto", "cpu", "cuda"]
_BLOCK_BYTES = 64 << 20  # float64 bytes of one block of rows/columns


class DegenerateMatrixError(WbfeError, ValueError):
    """A matrix with no meaningful spectrum (non-finite or all-zero entries); recorded as a skip."""


def resolve_device(device: str) -> "torch.device":
    """``auto`` -> CUDA when available, else CPU.

    Raises:
        InvalidOptionError: unknown device, or ``cuda`` without a CUDA device.
    """
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InvalidOptionError("--device cuda was asked for but no CUDA device is available")
        return torch.device(device)
    raise InvalidOptionError(f"device must be auto, cpu or cuda, not {device!r}")


def gram(matrix: "torch.Tensor", device: "torch.device") -> "torch.Tensor":
    """The smaller Gram matrix (WWᵀ if rows <= cols else WᵀW) in float64 on ``device``."""
    import torch

    rows, cols = matrix.shape
    wide = rows <= cols
    p, long = (rows, cols) if wide else (cols, rows)
    out = torch.zeros((p, p), dtype=torch.float64, device=device)
    step = max(1, _BLOCK_BYTES // (8 * p))
    for start in range(0, long, step):
        block = matrix[:, start : start + step] if wide else matrix[start : start + step, :].T
        block = block.to(device=device, dtype=torch.float64)
        out.addmm_(block, block.T)
    return out


def eigenvalues(matrices: Sequence["torch.Tensor"], device: "torch.device") -> np.ndarray:
    """Pooled eigenvalues of the smaller Gram matrices, ascending, noise-level values set to 0.

    Raises:
        DegenerateMatrixError: non-finite entries, or all entries zero.
    """
    import torch

    pooled = []
    for matrix in matrices:
        g = gram(matrix, device)
        if not bool(torch.isfinite(g).all()):
            raise DegenerateMatrixError("non-finite values (NaN or Inf)")
        pooled.append(torch.linalg.eigvalsh(g).cpu().numpy())
    e = np.sort(np.concatenate(pooled))
    top = e[-1] if e.size else 0.0
    if not top > 0.0:
        raise DegenerateMatrixError("all-zero matrix")
    # The Gram matrix carries rounding errors of order p·eps·max(e); below that an eigenvalue is 0.
    p = max(min(m.shape) for m in matrices)
    e[e <= top * p * np.finfo(np.float64).eps] = 0.0
    return e


def spectrum(matrices: Sequence["torch.Tensor"], device: "torch.device") -> Spectrum:
    """The :class:`Spectrum` of one matrix or of pooled slices of equal shape."""
    rows, cols = matrices[0].shape
    return Spectrum(eigs=eigenvalues(matrices, device), rows=int(rows), cols=int(cols), n_slices=len(matrices))
