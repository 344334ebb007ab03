"""The spectra of planned matrices, as jobs the pipeline runs on its workers: one matrix (or one
tensor's slices) at a time. Each spectrum carries what every metric group's ``from_matrices`` hook computes from the matrices.
:func:`planned_spectrum` is the one place a plan's convention decides which spectrum is taken."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from wbfe.engine.context import Context
from wbfe.engine.matrices import MatrixPlan
from wbfe.linalg.arrays import to_numpy
from wbfe.linalg.conv_fft import conv2d_fft_eigenvalues
from wbfe.linalg.spectra import DegenerateMatrixError, Spectrum, spectrum
from wbfe.metrics.ww_compat import ww_float32

__all__ = ["spectrum_of", "planned_spectrum"]


def planned_spectrum(matrices: list[Any], plan: Optional[MatrixPlan], device: Any, *, need_eigs: bool = True) -> Spectrum:
    """The spectrum of a planned entry's matrices: their pooled Gram eigenvalues, or for the ``fft`` convention
    WeightWatcher's FFT view of the kernel; DegenerateMatrixError for non-finite or all-zero entries."""
    if plan is None or plan.convention != "fft":
        return spectrum(matrices, device, need_eigs=need_eigs)

    kernel = ww_float32(to_numpy(matrices[0]), "conv2d_fft view")
    if not np.isfinite(kernel).all():
        raise DegenerateMatrixError("non-finite values (NaN or Inf)")
    if not kernel.any():
        raise DegenerateMatrixError("all-zero matrix")
    eigs, n, m = conv2d_fft_eigenvalues(kernel)
    return Spectrum(eigs=eigs, rows=n, cols=m)


def spectrum_of(matrices: list[Any], context: Context, name: str, *, need_eigs: Optional[bool] = None,
                plan: Optional[MatrixPlan] = None) -> Any:
    """The :class:`~wbfe.metrics.Spectrum` of ``matrices`` (as ``plan`` says, see :func:`planned_spectrum`) with every
    group's hook, or the :class:`DegenerateMatrixError` that says why there is none (returned, not raised)."""
    try:
        # Without a group that needs eigenvalues, BFE-W's moments come from a factorisation.
        needed = any(g.needs_eigenvalues for g in context.groups) if need_eigs is None else need_eigs
        spec = planned_spectrum(matrices, plan, context.device, need_eigs=needed)
        hooks = [g for g in context.groups if g.from_matrices is not None]
        if hooks:
            extra = {g.name: g.from_matrices(matrices, context.device, context.metric_options, name) for g in hooks}
            spec = dataclasses.replace(spec, extra=extra)
        return spec
    except DegenerateMatrixError as exc:
        return exc
