"""The places where WeightWatcher 0.7.7's choices differ from wbfe's, named one by one: :data:`WBFE` by default,
:data:`WEIGHTWATCHER` with ``ww_compatible=True`` (the switch and the key the provenance records). In
:mod:`wbfe.options`, below the metric groups that read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wbfe.errors import InvalidOptionError

__all__ = ["Conventions", "WBFE", "WEIGHTWATCHER", "conventions_for", "check_conventions", "WW_EVALS_THRESH",
           "WW_EPSILON"]

#: WeightWatcher 0.7.7 drops eigenvalues at or below this before its power-law fit (``EVALS_THRESH``).
WW_EVALS_THRESH = 1e-5
#: WeightWatcher 0.7.7's ``RMT_Util.EPSILON`` on a CPU machine: its entropy and histogram regulariser.
WW_EPSILON = 1e-10


@dataclass(frozen=True)
class Conventions:
    """One choice per place where the two differ.

    Attributes:
        name: ``wbfe`` or ``weightwatcher``.
        conv: the conv-kernel view (flatten, slices) a run uses when the caller leaves ``conv`` unset.
        ww_slices: ``slices`` cuts a 4-D kernel into WeightWatcher's ``conv2d`` matrices (in an intra chain too).
        skip_below_min_eigs: a matrix with fewer than ``min_eigs`` eigenvalues is left out, not only its tail fits.
        whole_spectrum: every group but BFE-W sees the whole matrix, its dead units' zero eigenvalues included.
        power_law: ``csn`` (Clauset–Shalizi–Newman, tails of ≥ ``min_tail``) or ``ww`` (WeightWatcher's ``WWFit``).
        evals_thresh: eigenvalues at or below it are dropped before the tail fits (0: exact zeros).
        entropy_epsilon: added inside the matrix entropy's logarithm.
        peak_log10: ``xmin_peak``'s lower end is log10(0.95·peak), 0.7.7's slip, rather than 0.95·peak.
        slice_svd: each conv slice's own SVD feeds rank_loss and sv_min; eigenvectors by WeightWatcher's arithmetic.
        ww_edit: smoothing and sharpening reproduce WeightWatcher's (:mod:`wbfe.metrics.ww_compat`).
    """

    name: Literal["wbfe", "weightwatcher"]
    conv: Literal["flatten", "slices"]
    ww_slices: bool
    skip_below_min_eigs: bool
    whole_spectrum: bool
    power_law: Literal["csn", "ww"]
    evals_thresh: float
    entropy_epsilon: float
    peak_log10: bool
    slice_svd: bool
    ww_edit: bool


WBFE = Conventions("wbfe", conv="flatten", ww_slices=False, skip_below_min_eigs=False, whole_spectrum=False,
                   power_law="csn", evals_thresh=0.0, entropy_epsilon=0.0, peak_log10=False, slice_svd=False,
                   ww_edit=False)
"""wbfe's own choices (docs/math.md)."""

WEIGHTWATCHER = Conventions("weightwatcher", conv="slices", ww_slices=True, skip_below_min_eigs=True,
                            whole_spectrum=True, power_law="ww", evals_thresh=WW_EVALS_THRESH,
                            entropy_epsilon=WW_EPSILON, peak_log10=True, slice_svd=True, ww_edit=True)
"""WeightWatcher 0.7.7's choices (docs/spectral-metrics.md)."""


def conventions_for(ww_compatible: bool) -> Conventions:
    """:data:`WEIGHTWATCHER` when the user asked for WeightWatcher's choices, else :data:`WBFE`."""
    return WEIGHTWATCHER if ww_compatible else WBFE


def check_conventions(conventions: object) -> Conventions:
    """:data:`WBFE` or :data:`WEIGHTWATCHER`, given as itself (or an equal copy) or by its name."""
    for known in (WBFE, WEIGHTWATCHER):
        if conventions == known or conventions == known.name:
            return known
    raise InvalidOptionError(f"conventions must be 'wbfe' or 'weightwatcher', not {conventions!r}")
