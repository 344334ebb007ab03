"""The scoring engine: the one path from an open checkpoint to its scores, which every feature (score, compare, the
adapter merge, report, watch, the Ray tasks) uses (docs/architecture.md). The engine imports no feature built on it
(enforced by the import contract in pyproject.toml)."""

from wbfe.engine.checkpoint import Progress, eigenvalues_of, layer_spectrum, provenance_of, score_intra, score_source
from wbfe.engine.context import Context
from wbfe.engine.jobs import planned_spectrum, spectrum_of
from wbfe.engine.plan import PlannedEntry, entries, matrices_of, plan_entry, planning_min_eigs, stream
from wbfe.engine.products import INTRA, IntraChain, Product
from wbfe.engine.result import ModelScore, finish
from wbfe.engine.rows import ROW_BATCH, Record, RowMaker, layer_row
from wbfe.engine.run import Done, Ties, run

__all__ = [
    "Context", "PlannedEntry", "entries", "plan_entry", "planning_min_eigs", "stream", "matrices_of",
    "spectrum_of", "planned_spectrum",
    "IntraChain", "Product", "INTRA",
    "layer_row", "RowMaker", "Record", "ROW_BATCH",
    "run", "Ties", "Done",
    "ModelScore", "finish",
    "Progress", "score_source", "provenance_of", "layer_spectrum", "eigenvalues_of", "score_intra",
]
