"""Re-read a few named matrices of a checkpoint, in one pass, for their ESD thumbnails."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

__all__ = ["read_eigenvalues"]


def read_eigenvalues(ref: Any, names: Iterable[str], options: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The eigenvalues of each matrix in ``names`` of checkpoint ``ref``, computed as the score that
    produced ``options`` (its ``model.options``: conv view, WeightWatcher mode, device) did.

    The source is opened once and only the wanted tensors are loaded. A name the checkpoint lacks
    is absent from the result (the caller says why).
    """
    from wbfe.engine import eigenvalues_of
    from wbfe.options import CONV_VIEWS, ScoreOptions

    conv = options.get("conv")
    score_options = ScoreOptions(conv=conv if conv in CONV_VIEWS else "flatten",
                                 ww_compatible=bool(options.get("ww_compatible")),
                                 device=str(options.get("device") or "auto"))
    return eigenvalues_of(ref, names, score_options)
