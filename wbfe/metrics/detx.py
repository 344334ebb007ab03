"""The det X = 1 condition (``--metrics detx``): WeightWatcher 0.7.7's ``detX=True`` / ``ERG=True``.

The columns are defined in docs/metrics.md (group ``detx``). The product is tested as a sum of logarithms from the top:
one pass instead of WeightWatcher's quadratic rescan (the same tail except where a product is within rounding of exactly
1), and finite where WeightWatcher's product overflows."""

from __future__ import annotations

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.metrics._group import GroupResult, MetricGroup, MetricOptions, Spectrum

__all__ = ["detx_tail", "COLUMNS", "GROUP"]

COLUMNS = ("detX_num", "detX_val", "detX_val_unrescaled", "num_ERG_spikes", "ERG_gap")


def detx_tail(eigs: np.ndarray) -> tuple[int, int, np.ndarray]:
    """``(detX_num, idx, e·n/Σe)`` of ascending, non-negative eigenvalues (at least one positive): the tail size, the
    index of its first eigenvalue, and the eigenvalues rescaled to mean 1. InvalidOptionError for any other."""
    e = np.asarray(eigs, dtype=np.float64)
    n = e.size
    if not (n and np.all(np.isfinite(e)) and e[0] >= 0.0 and e[-1] > 0.0 and np.all(e[1:] >= e[:-1])):
        raise InvalidOptionError("detx_tail needs ascending, finite, non-negative eigenvalues, at least one positive")
    scaled = e * (n / float(np.sum(e)))
    if n < 2 or not scaled[0] < scaled[-1]:
        return 0, 0, scaled
    with np.errstate(divide="ignore"):
        # log Π_{i >= idx} for idx = n−1 … 1
        log_products = np.cumsum(np.log(scaled[:0:-1]))
    below = np.flatnonzero(log_products < 0.0)
    if below.size == 0:
        return n, 1, scaled
    idx = n - 1 - int(below[0])
    return n - idx, idx, scaled


def _compute(spec: Spectrum, options: MetricOptions) -> GroupResult:
    from wbfe.metrics.htsr import spectrum_problem, fit_spectrum_power_law

    result = GroupResult()
    e = np.sort(np.asarray(spec.eigs if spec.eigs is not None else [], dtype=np.float64))
    problem = spectrum_problem(e)  # the htsr group's rule, and its reason
    if problem is not None:
        result.fail_all(COLUMNS, problem)
        return result
    num, idx, scaled = detx_tail(e)
    result.values["detX_num"] = result.values["num_ERG_spikes"] = num
    result.put_rescaled("detX_val", float(e[idx]), 1.0, spec.log_scale)
    result.values["detX_val_unrescaled"] = float(scaled[idx])  # scale-free: mean 1
    fit = fit_spectrum_power_law(spec, options)
    if fit.ok:
        result.values["ERG_gap"] = num - int(np.count_nonzero(e >= fit.xmin))
    else:
        result.fail("ERG_gap", f"power-law fit: {fit.reason}")
    return result


GROUP = MetricGroup(
    name="detx", columns=COLUMNS, summary_columns=("detX_num", "ERG_gap"), compute=_compute,
    description="det X = 1 tail and its gap to the power-law tail (WeightWatcher 0.7.7's detX / ERG)",
)
