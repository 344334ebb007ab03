"""The randomised control (``--metrics rand``): each matrix against a seeded element-wise shuffle.

The shuffle keeps W's entries and destroys their correlations, so its spectrum is a Marchenko–Pastur bulk except for
"correlation traps" (single large weights). Columns: docs/metrics.md, formulas: docs/math.md §4. The permutation is
seeded from ``MetricOptions.seed`` and the tensor's name, so a matrix gets the same control whatever order or thread it
is scored in."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from wbfe.errors import UnsupportedDtypeError
from wbfe.linalg.arrays import flat_bytes, is_torch, to_numpy
from wbfe.metrics._group import GroupResult, MetricGroup, MetricOptions, Spectrum

__all__ = ["ShuffledSpectrum", "shuffle_matrix", "shuffled_spectrum", "log_spectrum_distance", "mp_edge", "count_traps",
           "COLUMNS", "GROUP"]

COLUMNS = ("rand_distance", "rand_traps", "rand_bulk_max", "rand_lambda_max", "rand_max_ratio")
# Tracy–Widom scales above the edge an eigenvalue must reach to count as a trap: P(TW₁ > 4) ≈ 1e-4.
TW_MARGIN = 4.0


@dataclass(frozen=True)
class ShuffledSpectrum:
    """Eigenvalues of the shuffled matrices (pooled, ascending), their trap count and bulk edge.

    ``eigs`` and ``bulk_max`` are in units scaled by exp(−log_scale), as ``Spectrum.eigs`` is for a matrix whose Gram
    matrix would leave float64's range; ``log_scale`` = 0 otherwise."""

    eigs: np.ndarray
    traps: int
    bulk_max: float
    log_scale: float = 0.0


_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def shuffle_matrix(matrix: Any, rng: np.random.Generator) -> Any:
    """A copy of ``matrix`` (numpy or torch, returned as the same kind) with its entries permuted uniformly.

    The bits are shuffled as unsigned integers of the element's width: a bfloat16 matrix is permuted exactly, in its own
    dtype, with one copy and no index array. UnsupportedDtypeError for entries that are no such number (complex128,
    objects, text)."""
    copy: Any = matrix.detach().to("cpu", copy=True).contiguous() if is_torch(matrix) else np.array(matrix, order="C")
    width = copy.element_size() if is_torch(copy) else copy.itemsize
    if width not in _UINTS or getattr(copy.dtype, "kind", "f") not in "biufc":  # torch's dtypes are all numbers
        raise UnsupportedDtypeError(f"shuffle_matrix permutes numbers of 1, 2, 4 or 8 bytes, not {copy.dtype}")
    rng.shuffle(flat_bytes(copy).view(_UINTS[width]))  # the copy's own memory: it is contiguous and on the host
    return copy


def mp_edge(sigma2: float, rows: int, cols: int) -> float:
    """Marchenko–Pastur bulk edge of the Gram eigenvalues of a rows × cols matrix of entries of variance σ²."""
    return sigma2 * (math.sqrt(rows) + math.sqrt(cols)) ** 2


def count_traps(eigs: np.ndarray, rows: int, cols: int, mean: float, sigma2: float) -> tuple[int, float]:
    """``(traps, λ₊)`` of one shuffled matrix: eigenvalues above the edge plus the margin, less the mean's outlier.

    The mean μ of the entries is a rank-one term θ·uvᵀ with θ = |μ|·√(rows·cols); with s² = θ²/(σ²P) it leaves the bulk
    when s² > √γ, at σ²P·(1 + s²)(γ + s²)/s² (Benaych-Georges & Nadakuditi 2012)."""
    edge = mp_edge(sigma2, rows, cols)
    # The fluctuation scale of the largest Gram eigenvalue at the edge (Johnstone 2001).
    a, b = math.sqrt(rows), math.sqrt(cols)
    threshold = edge + TW_MARGIN * (sigma2 * (a + b) * (1.0 / a + 1.0 / b) ** (1.0 / 3.0))
    above = int(np.count_nonzero(eigs > threshold))
    p, big = sorted((rows, cols))
    gamma = p / big
    s2 = mean * mean * rows * cols / (sigma2 * big) if sigma2 > 0.0 else math.inf
    if s2 > math.sqrt(gamma):
        at = sigma2 * big * (1.0 + s2) * (gamma + s2) / s2 if math.isfinite(s2) else math.inf
        if at > threshold:
            above = max(0, above - 1)
    return above, edge


def shuffled_spectrum(matrices: Sequence[Any], device: Any, options: MetricOptions, name: str) -> ShuffledSpectrum:
    """The ``from_matrices`` hook: each matrix shuffled (seeded by ``options.seed`` and ``name``) and its spectrum taken
    by the pipeline's own eigen-solve (DegenerateMatrixError as the matrix itself)."""
    from wbfe.linalg.spectra import spectrum

    parts, traps, edge, log_scale = [], 0, 0.0, 0.0
    for index, matrix in enumerate(matrices):
        seed = np.random.SeedSequence([int(options.seed), zlib.crc32(name.encode()), index])
        shuffled = spectrum([shuffle_matrix(matrix, np.random.default_rng(seed))], device)
        e, log_scale = np.asarray(shuffled.eigs), shuffled.log_scale  # slices share one scale: same entries' range
        n = math.prod(matrix.shape)
        # The mean in the spectrum's units (entries times exp(−log_scale / 2)); Σw² is the trace of
        # the Gram matrix: the sum of the (unclipped) eigenvalues, to rounding.
        mean = float(np.sum(to_numpy(matrix), dtype=np.float64)) / n * math.exp(-0.5 * log_scale)
        sigma2 = max(float(np.sum(e)) / n - mean * mean, 0.0)
        count, bulk = count_traps(e, int(matrix.shape[0]), int(matrix.shape[1]), mean, sigma2)
        traps += count
        edge = max(edge, bulk)
        parts.append(e)
    return ShuffledSpectrum(eigs=np.sort(np.concatenate(parts)), traps=traps, bulk_max=edge, log_scale=log_scale)


def log_spectrum_distance(a: np.ndarray, b: np.ndarray, *, shift: float = 0.0) -> float:
    """Wasserstein-1 distance between the distributions of log e over the nonzero eigenvalues of
    two spectra (scale-aware: multiplying W by c shifts every log e by 2·log c), with ``shift``
    added to every log e of ``b``. NaN when either spectrum has no nonzero eigenvalue."""
    from scipy.stats import wasserstein_distance

    la = np.log(a[a > 0.0])
    lb = np.log(b[b > 0.0]) + shift
    if la.size == 0 or lb.size == 0:
        return math.nan
    return float(wasserstein_distance(la, lb))


def _compute(spec: Spectrum, options: MetricOptions) -> GroupResult:
    result = GroupResult()
    shuffled = spec.extra.get("rand")
    e = spec.eigs
    if not isinstance(shuffled, ShuffledSpectrum) or e is None or not e.size or not e[-1] > 0.0:
        result.fail_all(COLUMNS, "no shuffled spectrum (the rand group needs the matrix itself)")
        return result
    # Both spectra in true units, in logs (either may be scaled for float64's range).
    shift = shuffled.log_scale - spec.log_scale
    result.values["rand_distance"] = log_spectrum_distance(e, shuffled.eigs, shift=shift)
    result.values["rand_traps"] = shuffled.traps
    result.put_rescaled("rand_bulk_max", shuffled.bulk_max, 1.0, shuffled.log_scale)
    result.put_rescaled("rand_lambda_max", float(shuffled.eigs[-1]), 1.0, shuffled.log_scale)
    result.values["rand_max_ratio"] = float(math.exp(math.log(shuffled.eigs[-1] / e[-1]) + shift))
    return result


GROUP = MetricGroup(
    name="rand", columns=COLUMNS, summary_columns=("rand_distance", "rand_traps"), compute=_compute,
    description="randomised control: a seeded element-wise shuffle of each matrix, correlation traps",
    needs_eigenvalues=True, from_matrices=shuffled_spectrum,
)
