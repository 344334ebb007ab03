"""``--fit e_tpl`` with ``--ww-compatible`` (docs/metrics.md): WeightWatcher's E_TPL is TPL with
xmin_peak, and its xmin_peak range starts at log10(0.95·peak); so e_tpl equals tpl exactly when
tpl's own xmin (the full scan, computed independently here) lies in [log10(0.95·peak), 1.5·peak)."""

from __future__ import annotations

import math

import numpy as np

from wbfe.options.conventions import WEIGHTWATCHER
from wbfe.metrics.fingers import esd_peak, fit_tail, peak_range


def _spectrum(df: float, seed: int) -> np.ndarray:
    w = np.random.default_rng(seed).standard_t(df, size=(60, 120))
    x = np.sort(np.linalg.eigvalsh(w @ w.T / 120))
    return x[x > 1e-5]


def test_ww_e_tpl_is_tpl_exactly_when_tpls_xmin_is_in_the_peak_range() -> None:
    same = []
    for df in (1.5, 2.5, 3.5, 6.0):
        for seed in range(4):
            x = _spectrum(df, seed)
            lo, hi = peak_range(x, log10=True)
            peak = esd_peak(x)
            assert (lo, hi) == (math.log10(0.95 * peak), 1.5 * peak)  # WeightWatcher's: a log10 at the lower end
            tpl = fit_tail(x, fit="tpl", conventions=WEIGHTWATCHER)
            e_tpl = fit_tail(x, fit="e_tpl", conventions=WEIGHTWATCHER)
            inside = lo <= tpl.xmin < hi
            assert ((e_tpl.alpha, e_tpl.xmin, e_tpl.lam) == (tpl.alpha, tpl.xmin, tpl.lam)) is inside, (df, seed)
            if not inside:  # the best candidate in the range instead: never a better KS distance
                assert lo <= e_tpl.xmin < hi and e_tpl.ks >= tpl.ks
            same.append(inside)
    assert sum(same) == 8  # both cases occur: 8 of the 16 spectra
