"""Finished spectra become layer rows: every metric group's columns beside the matrix's shape,
role and form, NaN columns with their reasons. Groups with ``compute_many`` get the spectra of one
shape together (an MoE layer's experts, a ResNet stage's convolutions)."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Union

from wbfe.engine.context import Context
from wbfe.engine.matrices import MatrixPlan, Plan, Skip, component_of
from wbfe.linalg.spectra import DegenerateMatrixError
from wbfe.render.text import shape_text
from wbfe.sources import TensorEntry

__all__ = ["layer_row", "RowMaker", "Record", "ROW_BATCH"]

# record(entry, skip or row), called in stream order.
Record = Callable[[TensorEntry, Union[Skip, dict[str, Any]]], None]

# The most rows held back for one compute_many call: the spectra are small next to their matrices.
ROW_BATCH = 256


def too_few(group: Any, spec: Any, min_eigs: int) -> bool:
    """Whether ``group`` fits a spectrum's tail and this one has too few eigenvalues for it."""
    return bool(group.tail_columns) and spec.n_eigs < min_eigs


def nothing_to_compute(group: Any, spec: Any, min_eigs: int) -> bool:
    """Whether every column of ``group`` is a tail fit this spectrum is too small for."""
    return too_few(group, spec, min_eigs) and set(group.tail_columns) >= set(group.columns)


def group_view(group: Any, spec: Any, context: Context) -> Any:
    """The spectrum ``group`` is computed on: the live part's, or under ``whole_spectrum`` the whole matrix's for all
    but BFE-W (WeightWatcher's rank_loss, weak_rank_loss, sv_min count the dead units' zero eigenvalues)."""
    return spec.whole() if context.metric_options.conventions.whole_spectrum and group.name != "bfe" else spec


def layer_row(
    plan: MatrixPlan, spec: Any, context: Context, quant: Optional[str] = None,
    computed: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """One layer's row; ``computed`` holds group results already computed (by ``compute_many``)."""
    min_eigs = context.options.min_eigs
    row: dict[str, Any] = {
        "name": plan.name, "role": plan.role, "component": component_of(plan.name), "shape": list(plan.shape),
        "dtype": plan.dtype, "quant": quant, "convention": plan.convention, "rows": spec.rows, "cols": spec.cols,
        "n_slices": spec.n_slices, "n_eigs": spec.n_eigs, "gamma": spec.gamma, "form": spec.form,
        "dead_rows": spec.dead_rows, "dead_cols": spec.dead_cols,
    }
    reasons: dict[str, str] = {}
    if spec.dead_rows or spec.dead_cols:
        dead = " and ".join(f"{n} all-zero {what}" for n, what in ((spec.dead_rows, "row(s)"),
                                                                      (spec.dead_cols, "column(s)")) if n)
        reasons["dead_units"] = (f"{dead} (dead or pruned units) left out: BFE-W and the spectrum are of the live "
                                 f"{shape_text((spec.rows, spec.cols))} part")
    for group in context.groups:
        if not nothing_to_compute(group, spec, min_eigs):
            out = (computed[group.name] if computed and group.name in computed
                   else group.compute(group_view(group, spec, context), context.metric_options))
            row.update(out.values)
            reasons.update(out.reasons)
        if too_few(group, spec, min_eigs):
            why = f"too few eigenvalues for a tail fit: {spec.n_eigs} < min_eigs={min_eigs}"
            row.update({column: math.nan for column in group.tail_columns})
            reasons.update({column: why for column in group.tail_columns})
    row["reasons"] = reasons
    return row


class RowMaker:
    """Turns finished spectra into layer rows and hands each row (or skip) to ``record``, in stream
    order. Where a group has ``compute_many``, up to :data:`ROW_BATCH` spectra are held back (skips
    between them too, to keep the order) and those of one shape are fitted together: an MoE layer's
    experts, stored interleaved (w1, w2, w3 of each expert) or with biases between them."""

    def __init__(self, context: Context, record: Record) -> None:
        self.context, self.record = context, record
        self.batching = any(g.compute_many is not None for g in context.groups)
        self.pending: list[tuple[TensorEntry, Plan, Any]] = []
        self.held = 0  # spectra among the pending entries

    def add(self, entry: TensorEntry, plan: Plan, outcome: Any) -> None:
        """One finished entry: its skip, its spectrum, or the DegenerateMatrixError it met."""
        if isinstance(outcome, DegenerateMatrixError):
            outcome = Skip(entry.name, str(outcome), entry.shape, entry.dtype)
        self.pending.append((entry, plan, outcome))
        if not isinstance(outcome, Skip):
            self.held += 1
        if not self.batching or self.held >= ROW_BATCH:
            self.flush()

    def flush(self) -> None:
        """Rows of every pending entry, the equal-shaped spectra fitted together."""
        runs: dict[tuple[int, ...], list[int]] = {}
        for k, (_, plan, outcome) in enumerate(self.pending):
            if not isinstance(outcome, Skip):
                assert isinstance(plan, MatrixPlan)
                runs.setdefault((outcome.rows, outcome.cols, outcome.dead_rows, outcome.dead_cols, plan.n_slices,
                                 outcome.n_eigs), []).append(k)
        done: dict[int, dict[str, Any]] = {}
        min_eigs = self.context.options.min_eigs
        for members in runs.values():
            specs = [self.pending[k][2] for k in members]
            for group in self.context.groups:
                if (group.compute_many is not None and len(specs) > 1
                        and not nothing_to_compute(group, specs[0], min_eigs)):
                    views = [group_view(group, spec, self.context) for spec in specs]
                    for k, out in zip(members, group.compute_many(views, self.context.metric_options)):
                        done.setdefault(k, {})[group.name] = out
        for k, (entry, plan, outcome) in enumerate(self.pending):
            if isinstance(outcome, Skip):
                self.record(entry, outcome)
            else:
                assert isinstance(plan, MatrixPlan)
                self.record(entry, layer_row(plan, outcome, self.context, entry.quant, done.get(k)))
        self.pending.clear()
        self.held = 0
