"""What changed between two versions of one matrix: the metric groups on both sides, distances
between their spectra, the size and rank of the difference, and how far their leading singular
subspaces moved. ``wbfe compare`` and the LoRA merge (:mod:`wbfe.adapters`) report these columns."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from wbfe.engine.context import Context
from wbfe.engine.matrices import MatrixPlan, as_matrices
from wbfe.engine.rows import layer_row
from wbfe.linalg.arrays import to_numpy
from wbfe.linalg.spectra import max_abs, near_one, shift_for
from wbfe.metrics.rand import log_spectrum_distance
from wbfe.render.text import is_number

__all__ = ["matrix_change", "top_singular", "subspace_overlap"]


def top_singular(matrix: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(U_k, s_k, V_k)``: the k largest singular values of a float64 matrix, descending, and their left and right
    singular vectors (columns); k is cut to the number of nonzero ones. From the top-k eigenvectors of the smaller Gram
    matrix (a product and a partial eigen-solve, cheaper than a dense SVD), the other side as M·v / s."""
    from scipy.linalg import eigh

    wide = matrix.shape[0] <= matrix.shape[1]
    gram = matrix @ matrix.T if wide else matrix.T @ matrix
    p = gram.shape[0]
    k = min(k, p)
    values, vectors = eigh(gram, subset_by_index=[p - k, p - 1], check_finite=False, overwrite_a=True)
    values, vectors = values[::-1], vectors[:, ::-1]
    # Below p·eps·λ_max an eigenvalue of the Gram matrix is rounding (as in wbfe.linalg.spectra).
    keep = values > max(values[0], 0.0) * p * np.finfo(np.float64).eps
    s = np.sqrt(values[keep])
    vectors = vectors[:, keep]
    other = (matrix.T @ vectors if wide else matrix @ vectors) / s
    return (vectors, s, other) if wide else (other, s, vectors)


def subspace_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """‖aᵀb‖_F² / k for two matrices of k orthonormal columns each (the first k of either, when one has more): the mean
    squared cosine of the principal angles between their spans (1 identical, 0 orthogonal)."""
    k = min(a.shape[1], b.shape[1])
    return float(np.sum((a[:, :k].T @ b[:, :k]) ** 2) / k) if k else math.nan


def _row_scaled_change(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """``(rel_frobenius_rowscaled, row_scale_cv)`` of two out × in float64 matrices, each already brought near 1 on
    its own (:func:`~wbfe.linalg.spectra.near_one`: both are free of either matrix's scale) (docs/compare.md): the
    change left once each output row of ``b`` is rescaled onto ``a`` by least squares, and the spread of those scales
    (NaN where no row of ``b`` is nonzero or the scales' mean is 0)."""
    bb = np.einsum("ij,ij->i", b, b)
    ab = np.einsum("ij,ij->i", a, b)
    live = bb > 0.0
    s = np.divide(ab, bb, out=np.zeros_like(bb), where=live)
    residual = float(np.linalg.norm(a - s[:, None] * b))
    norm_a = float(np.linalg.norm(a))
    mean = float(s[live].mean()) if live.any() else 0.0
    cv = float(s[live].std() / abs(mean)) if mean != 0.0 else math.nan
    return residual / norm_a, cv


def matrix_change(
    tensor_a: Any, tensor_b: Any, plan: MatrixPlan, spec_a: Any, spec_b: Any, context: Context, top_k: int,
) -> dict[str, Any]:
    """How ``tensor_b`` differs from ``tensor_a`` (one planned matrix, spectra with every group's hooks):
    each group's columns on both sides as a score's row has them, and the comparison columns of
    docs/compare.md; NaN columns with their reasons."""
    row: dict[str, Any] = {"n_eigs": spec_a.n_eigs, "gamma": spec_a.gamma, "form": spec_a.form}
    reasons: dict[str, str] = {}
    side_a, side_b = layer_row(plan, spec_a, context), layer_row(plan, spec_b, context)
    why_a, why_b = side_a["reasons"], side_b["reasons"]
    for group in context.groups:
        for column in group.columns:
            va: Any = side_a.get(column)
            vb: Any = side_b.get(column)
            row[f"{column}_a"], row[f"{column}_b"] = va, vb
            if column in why_a or column in why_b:
                row[f"d_{column}"] = math.nan
                reasons[f"d_{column}"] = "; ".join(f"{lab}: {why[column]}" for lab, why in (("A", why_a), ("B", why_b))
                                                   if column in why)
            elif is_number(va) and is_number(vb):
                row[f"d_{column}"] = float(vb) - float(va)
                if not math.isfinite(row[f"d_{column}"]):
                    reasons[f"d_{column}"] = "not finite on one side"
    reasons.update({f"{column}_a": why for column, why in why_a.items()})
    reasons.update({f"{column}_b": why for column, why in why_b.items()})
    # Spectra scaled for float64's range (Spectrum.log_scale) are compared in true units.
    row["w1_log_eigs"] = log_spectrum_distance(spec_a.eigs, spec_b.eigs, shift=spec_b.log_scale - spec_a.log_scale)
    # The planned out × in matrices as float64 copies on the CPU, never the caller's storage (b64 becomes B − A below);
    # both are scaled by one power of two below, so that Gram matrices and norms stay inside float64's range.
    a64, b64 = (to_numpy(as_matrices(t, plan)[0]).reshape(plan.rows, plan.cols).astype(np.float64)
                for t in (tensor_a, tensor_b))
    # One pass over each side for its largest entry: every power-of-two factor below follows from the two.
    top_a, top_b = max_abs(a64), max_abs(b64)
    # The subspaces and the row scales are free of each side's scale: each is brought near 1 on its own (one factor
    # for both would flush the smaller side to zero where their scales are far apart).
    near_a, near_b = near_one(a64, top_a)[0], near_one(b64, top_b)[0]
    u_a, _, v_a = top_singular(near_a, top_k)
    u_b, _, v_b = top_singular(near_b, top_k)
    row["rel_frobenius_rowscaled"], row["row_scale_cv"] = _row_scaled_change(near_a, near_b)
    norm_a = float(np.linalg.norm(near_a))  # ‖A‖·2^shift_a: on A's own scale, however far B's is
    del near_a, near_b
    shift_a, shift = shift_for(top_a), shift_for(max(top_a, top_b))
    factor = math.ldexp(1.0, shift)  # the spectrum's own rule, one factor for both
    if factor != 1.0:
        a64 *= factor
        b64 *= factor
    if not math.isfinite(row["row_scale_cv"]):
        reasons["row_scale_cv"] = "no row of B is nonzero, or the fitted row scales average to 0"
    b64 -= a64  # B − A, in place: two float64 copies at most
    del a64
    near_d, f_d = near_one(b64)  # ‖B − A‖_F, its squares kept inside float64's range
    norm_d = float(np.linalg.norm(near_d)) / f_d
    del near_d
    # ‖B − A‖/‖A‖ = norm_d/norm_a · 2^(shift_a − shift): past float64's range where A is that much smaller than B.
    rel, exponent = norm_d / norm_a, shift_a - shift
    row["frobenius_delta"] = norm_d / factor
    row["rel_frobenius"] = math.ldexp(rel, exponent) if math.frexp(rel)[1] + exponent <= 1024 else math.nan
    if math.isnan(row["rel_frobenius"]):
        reasons["rel_frobenius"] = (f"outside float64's range: ‖B − A‖ / ‖A‖ is of order "
                                    f"1e{math.log10(rel) + exponent * math.log10(2.0):.0f}")
    if norm_d > 0.0:
        spectral_d = float(top_singular(b64, 1)[1][0])
        row["spectral_delta"] = spectral_d / factor
        # ‖Δ‖_F² / ‖Δ‖₂², as the ratio's square only where the squares would leave float64's range
        in_range = 1e-150 < spectral_d and norm_d < 1e150
        row["stable_rank_delta"] = norm_d ** 2 / spectral_d ** 2 if in_range else (norm_d / spectral_d) ** 2
    else:
        row.update(spectral_delta=0.0, stable_rank_delta=math.nan)
        reasons["stable_rank_delta"] = "B − A = 0: no change to take the rank of"
    row.update(top_k=min(u_a.shape[1], u_b.shape[1]), overlap_in=subspace_overlap(v_a, v_b),
               overlap_out=subspace_overlap(u_a, u_b), reasons=reasons)
    return row
