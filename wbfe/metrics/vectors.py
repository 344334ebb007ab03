"""Eigenvector localisation (``--metrics vectors``): WeightWatcher 0.7.7's ``vectors=True`` columns (docs/metrics.md).

The ``from_matrices`` hook computes the eigenvectors: by default ``torch.linalg.eigh`` of the float64 Gram matrix, the
tail the top ``num_pl_spikes`` of the pooled order. Under ``slice_svd`` WeightWatcher's arithmetic bit for bit
(``np.matmul``, scipy's general ``eig``, xmin from the squared SVD values): its split puts the eigenvector at xmin on
either side by rounding."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import numpy as np

from wbfe._deps import require_torch
from wbfe.linalg.arrays import to_numpy, to_torch
from wbfe.linalg.spectra import range_shift
from wbfe.metrics._group import GroupResult, MetricGroup, MetricOptions, Spectrum
from wbfe.options.conventions import WW_EPSILON

__all__ = ["EigenvectorData", "eigenvector_data", "COLUMNS", "GROUP"]

WW_BINS = 100  # WeightWatcher 0.7.7's histogram bin count
_METRICS = ("vec_entropy", "loc_ratio", "part_ratio")  # WeightWatcher's column order
COLUMNS = tuple(f"{part}_{stat}_{metric}" for metric in _METRICS for part in ("bulk", "tail")
                for stat in ("mean", "var"))


@dataclass(frozen=True)
class EigenvectorData:
    """Per-eigenvector numbers of one matrix (pooled over slices), in the order of ``order``.

    Attributes:
        eigs: the eigenvalue of each eigenvector (units of the matrices as given).
        vec_entropy, loc_ratio, part_ratio: the three metrics, one per eigenvector.
        svd_eigs: under ``slice_svd`` only: the pooled squared singular values WeightWatcher fits.
    """

    eigs: np.ndarray
    vec_entropy: np.ndarray
    loc_ratio: np.ndarray
    part_ratio: np.ndarray
    svd_eigs: Optional[np.ndarray] = None


def _metrics(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """WeightWatcher's discrete entropy, ‖v‖₁ / ‖v‖_∞ and ‖v‖₂ / ‖v‖₄ of each column v (docs/metrics.md)."""
    # Every metric depends on the moduli only: sign-free, and right for the complex eigenvectors
    # a general solver returns when rounding makes X's null-space eigenvalues complex.
    moduli = np.abs(vectors)
    entropies = np.empty(moduli.shape[1])
    for j in range(moduli.shape[1]):  # np.histogram per column: its bin assignment is what the value depends on
        h = np.histogram(moduli[:, j] - np.mean(moduli[:, j]), density=True, bins=WW_BINS)[0]
        p = (h + WW_EPSILON) / np.sqrt(2 * np.pi)
        p = p / np.sum(p)
        entropies[j] = -np.sum(p * np.log(p))
    sq = moduli * moduli
    return (entropies, np.sum(moduli, axis=0) / np.max(moduli, axis=0),
            np.sqrt(np.sum(sq, axis=0)) / np.sum(sq * sq, axis=0) ** 0.25)


def _ww_slice(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """WeightWatcher's ``apply_analyze_eigenvectors`` on one matrix, and its SVD eigenvalues."""
    from scipy.linalg import eig, svd

    evals, v = eig(np.matmul(w, w.T) if w.shape[0] <= w.shape[1] else np.matmul(w.T, w))
    sv = svd(w, compute_uv=False)
    return (np.real(evals), *_metrics(v), sv * sv)


def _default_slice(matrix: Any, device: Any, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    require_torch("--metrics vectors without --ww-compatible (which uses scipy)")
    import torch

    w = to_torch(matrix).detach().to(device=device, dtype=torch.float64)
    if scale != 1.0:
        w = w * scale  # a power of two: exact, and the eigenvectors do not depend on it
    evals, v = torch.linalg.eigh(w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w)
    return (evals.cpu().numpy(), *_metrics(v.cpu().numpy()))


def eigenvector_data(matrices: Sequence[Any], device: Any, options: MetricOptions,
                     name: str) -> Union[EigenvectorData, str]:
    """The ``from_matrices`` hook: the eigenvector metrics of every matrix (or conv slice), pooled, or why there are
    none; the default mode's eigen-solve runs on ``device``, on matrices brought back into float64's range by a
    common power of two where their Gram matrix would leave it (the eigenvalues then in those units: only their
    order is used); ``name`` is unused (nothing here is random)."""
    ww = options.conventions.slice_svd
    scale = math.ldexp(1.0, range_shift(matrices))  # one factor for all slices: pooled eigenvalues stay comparable
    if scale != 1.0 and ww:
        largest = max(float(np.max(np.abs(to_numpy(m)), initial=0.0)) for m in matrices)
        return (f"the Gram matrix leaves float64's range (entries up to {largest:.0e}), where "
                "WeightWatcher's arithmetic gives no eigenvectors")
    parts: list[tuple[np.ndarray, ...]] = [_ww_slice(to_numpy(m).astype(np.float64)) if ww
                                           else _default_slice(m, device, scale) for m in matrices]
    eigs, ent, loc, part = (np.concatenate([p[i] for p in parts]) for i in range(4))
    svd_eigs = np.sort(np.concatenate([p[4] for p in parts])) if ww else None
    return EigenvectorData(eigs=eigs, vec_entropy=ent, loc_ratio=loc, part_ratio=part, svd_eigs=svd_eigs)


def _tail_mask(data: EigenvectorData, spec: Spectrum, options: MetricOptions) -> tuple[Optional[np.ndarray], str]:
    from wbfe.metrics.htsr import fit_spectrum_power_law

    ww = options.conventions.slice_svd
    fit = fit_spectrum_power_law(Spectrum(eigs=data.svd_eigs, rows=spec.rows, cols=spec.cols, n_slices=spec.n_slices)
                                 if ww else spec, options)
    if not fit.ok:
        return None, f"power-law fit: {fit.reason}"
    if ww:
        return data.eigs >= fit.xmin, ""
    assert spec.eigs is not None
    n_tail = int(np.count_nonzero(spec.eigs >= fit.xmin))
    mask = np.zeros(data.eigs.size, dtype=bool)
    mask[np.argsort(data.eigs, kind="stable")[data.eigs.size - n_tail:]] = True
    return mask, ""


def _compute(spec: Spectrum, options: MetricOptions) -> GroupResult:
    result = GroupResult()
    data = spec.extra.get("vectors")
    if not isinstance(data, EigenvectorData):
        result.fail_all(COLUMNS, data if isinstance(data, str)
                        else "no eigenvectors (the vectors group needs the matrix itself)")
        return result
    tail, why = _tail_mask(data, spec, options)
    for metric in _METRICS:
        values = getattr(data, metric)
        for part in ("bulk", "tail"):
            columns = (f"{part}_mean_{metric}", f"{part}_var_{metric}")
            if tail is None:
                result.fail_all(columns, why)
                continue
            chosen = values[~tail] if part == "bulk" else values[tail]
            if chosen.size == 0:
                result.fail_all(columns, f"no eigenvector in the {part} (split at the power-law xmin)")
                continue
            result.values[columns[0]] = float(np.mean(chosen))
            result.values[columns[1]] = float(np.var(chosen))
    return result


GROUP = MetricGroup(
    name="vectors",
    columns=COLUMNS,
    summary_columns=("tail_mean_loc_ratio", "tail_mean_part_ratio"),
    compute=_compute,
    description="eigenvector localisation in the bulk and tail (WeightWatcher 0.7.7's vectors=True)",
    from_matrices=eigenvector_data,
    tail_columns=COLUMNS,  # the bulk/tail split comes from the power-law fit
)
