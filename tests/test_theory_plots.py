"""The theory figures over a sweep of hundreds of decades: drawn right, and silent (``wbfe theory curve --r-min 1e-300
--r-max 1e300`` printed matplotlib's and numpy's overflow warnings, its axes fell back to 1..10, the curves
off the figure; fixed limits then made the decade ticks overflow)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wbfe.theory.reports import write_curve
from wbfe.theory.settings import CurveSettings


def test_a_curve_over_600_decades_is_drawn_on_its_range_without_a_warning(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import wbfe.reporting.plots.theory as plots

    figures: dict[str, Any] = {}
    real_save = plots.save

    def keep(fig: Any, path: Any, **kw: Any) -> Path:
        figures[Path(path).name] = fig
        return real_save(fig, path, **kw)

    monkeypatch.setattr(plots, "save", keep)
    settings = CurveSettings(r_min=1e-300, r_max=1e300, points=12, k=40, d=50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = write_curve(settings, tmp_path)
    assert [str(w.message) for w in caught] == []
    eps = np.array(data["sweep"]["eps"])
    assert eps.min() < 1e-300 and data["fit"]["refinement"] == pytest.approx(-1.0, abs=1e-6)
    for name in ("staircase.png", "eps.png", "kc.png"):
        ax = figures[name].axes[0]
        lo, hi = ax.get_xlim()  # log10 r on a linear axis
        assert lo <= -300 and hi >= 300 and hi - lo <= 660, name
        for line in ax.get_lines():
            assert np.all(np.isfinite(np.asarray(line.get_ydata(), dtype=float))), (name, line.get_label())
    ax = figures["eps.png"].axes[0]
    low, high = ax.get_ylim()
    assert low <= np.log10(eps.min()) and high >= np.log10(eps.max())
    # The eps curve is log10 of the sweep's eps, and the fitted refinement line has the fitted slope
    curve, fitted = ax.get_lines()[:2]
    assert np.array_equal(curve.get_ydata(), np.log10(eps))
    (x0, x1), (y0, y1) = fitted.get_xdata(), fitted.get_ydata()
    assert (y1 - y0) / (x1 - x0) == pytest.approx(data["fit"]["refinement"], rel=1e-12)
