"""Re-read a few named matrices of a checkpoint, in one pass, for their ESD thumbnails."""

from __future__ import annotations

from typing import Any, Iterable, Literal, Mapping

import numpy as np

__all__ = ["read_eigenvalues"]


def read_eigenvalues(ref: Any, names: Iterable[str], options: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The eigenvalues of each matrix in ``names`` of checkpoint ``ref``, computed as the score that
    produced ``options`` (its ``model.options``: conv convention, WeightWatcher mode, device) did.

    The source is opened once and only the wanted tensors are loaded. A name the checkpoint lacks
    is absent from the result (the caller says why).
    """
    from wbfe.matrices import as_matrices, plan_matrix
    from wbfe.matrices import Skip
    from wbfe.scoring import _stream, _ww_matrices  # the tensors as score() saw them; WW's conv slices
    from wbfe.sources import open_source
    from wbfe.spectra import eigenvalues, resolve_device

    wanted = set(names)
    conv: Literal["flatten", "slices"] = "slices" if options.get("conv") == "slices" else "flatten"
    device = resolve_device(str(options.get("device") or "auto"))
    out: dict[str, np.ndarray] = {}
    with open_source(ref) as source:
        # Dequantised and split per expert as score() streams them, so every scored row can be re-read.
        for entry, consumed in _stream(source):
            if entry.name not in wanted or entry.skip is not None or consumed is not None:
                continue
            plan = plan_matrix(entry.name, entry.shape, entry.dtype, conv=conv, min_eigs=1)
            if isinstance(plan, Skip):
                continue
            tensor = entry.load()
            matrices = _ww_matrices(tensor, plan) if options.get("ww_compatible") else as_matrices(tensor, plan)
            out[entry.name] = np.asarray(eigenvalues(matrices, device), dtype=float)
            if len(out) == len(wanted):
                break
    return out
