"""Tests of wbfe.metrics.detx.detx_tail's refusals (its tail sizes are checked against WeightWatcher in
test_ww_parity.py and through smoothing in test_editing.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.test_htsr import UNUSABLE_SPECTRA
from wbfe.errors import InvalidOptionError
from wbfe.metrics.detx import detx_tail


@pytest.mark.parametrize("eigs", [[], [0.0, 0.0, 0.0], [1.0, math.nan, 3.0], [-1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
def test_spectra_outside_its_domain_are_refused(eigs: list) -> None:
    # [] and all zeros raised ZeroDivisionError; NaN, negative and descending values gave tails with no reason
    with pytest.raises(InvalidOptionError, match="ascending, finite, non-negative"):
        detx_tail(np.array(eigs))



@pytest.mark.parametrize("eigs,reason", UNUSABLE_SPECTRA)
def test_unusable_spectrum_gets_the_htsr_groups_reason(eigs: np.ndarray, reason: str) -> None:
    # one rule for both groups (detx said only "no usable spectrum (empty, non-finite, negative or all zero)")
    from wbfe.metrics import detx, htsr
    from wbfe.metrics._group import MetricOptions, Spectrum

    for group in (detx.GROUP, htsr.GROUP):
        result = group.compute(Spectrum(eigs, 20, 30), MetricOptions())
        assert set(result.reasons) == set(group.columns)
        assert set(result.reasons.values()) == {reason}
        assert all(math.isnan(result.values[c]) for c in group.columns)


def test_erg_gap_without_a_power_law_fit_says_why() -> None:
    from wbfe.metrics import detx
    from wbfe.metrics._group import MetricOptions, Spectrum

    result = detx.GROUP.compute(Spectrum(np.array([0.5, 1.0, 2.0, 3.0, 7.0]), 5, 9), MetricOptions())
    assert result.reasons == {"ERG_gap": "power-law fit: only 5 positive value(s), need a tail of at least 10"}
    # e/2.7 multiplied from the top: 2.59, 2.88, 2.13, then 0.79 < 1: the det X = 1 tail is the top four
    assert result.values["detX_num"] == 4 and result.values["detX_val"] == 1.0
