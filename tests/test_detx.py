"""Tests of wbfe.metrics.detx.detx_tail's refusals (its tail sizes are checked against WeightWatcher in
test_ww_parity.py and through smoothing in test_editing.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wbfe.errors import InvalidOptionError
from wbfe.metrics.detx import detx_tail


@pytest.mark.parametrize("eigs", [[], [0.0, 0.0, 0.0], [1.0, math.nan, 3.0], [-1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
def test_spectra_outside_its_domain_are_refused(eigs: list) -> None:
    # [] and all zeros raised ZeroDivisionError; NaN, negative and descending values gave tails with no reason
    with pytest.raises(InvalidOptionError, match="ascending, finite, non-negative"):
        detx_tail(np.array(eigs))

