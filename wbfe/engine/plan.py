"""A checkpoint's entries as the engine sees them: quantised weights dequantised, fused expert
stacks split, each planned (analysed how, or skipped why). Every feature that walks a
checkpoint's matrices (score, compare, report, the adapter merge, Ray parts) reads this stream."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, NamedTuple, Optional

from wbfe.engine.experts import expand_experts
from wbfe.engine.heads import UNSELECTED
from wbfe.engine.matrices import MIN_BFE_EIGS, ConvView, MatrixPlan, Plan, Skip, as_matrices, plan_matrix
from wbfe.linalg.arrays import to_numpy
from wbfe.metrics.ww_compat import ww_conv2d_matrices, ww_float32
from wbfe.quant import dequantised
from wbfe.sources import TensorEntry

__all__ = ["PlannedEntry", "entries", "plan_entry", "planning_min_eigs", "stream", "matrices_of"]


class PlannedEntry(NamedTuple):
    """One entry of the stream with its plan: a :class:`MatrixPlan`, or the :class:`Skip` reason."""

    entry: TensorEntry
    plan: Plan


def entries(source: Any) -> Iterator[tuple[TensorEntry, Optional[str]]]:
    """The source's entries as matrices to plan: quantized weights dequantised, fused expert stacks
    split per expert; with each, the reason it is consumed by another (a scale), or None."""
    description = getattr(source, "description", None)
    layouts = description.layouts if description is not None else None
    return expand_experts(dequantised(source.entries(), source.config, layouts), source.config)


def plan_entry(
    entry: TensorEntry, consumed: Optional[str] = None, *, conv: ConvView = "flatten",
    min_eigs: int = MIN_BFE_EIGS, pattern: Any = None,
) -> Plan:
    """How ``entry`` is analysed, or why it is skipped: the reader could not give it densely, it
    is not selected by ``pattern`` (``--layers``), it is consumed by another tensor (a quantised
    weight's scale), or :func:`wbfe.engine.matrices.plan_matrix` refuses it."""
    unselected = UNSELECTED if pattern is not None and not pattern.search(entry.name) else None
    if (reason := entry.skip or unselected or consumed) is not None:
        return Skip(entry.name, reason, entry.shape, entry.dtype)
    return plan_matrix(entry.name, entry.shape, entry.dtype, conv=conv, min_eigs=min_eigs, layout=entry.layout)


def planning_min_eigs(options: Any) -> int:
    """The fewest eigenvalues a matrix needs to be analysed at all under ``options`` (a ScoreOptions): ``min_eigs``
    under ``skip_below_min_eigs``, else BFE-W's two. Compare and the adapter merge plan with it too."""
    return options.min_eigs if options.conventions.skip_below_min_eigs else MIN_BFE_EIGS


def stream(source: Any, options: Any) -> Iterator[PlannedEntry]:
    """Every entry of ``source`` planned under ``options`` (a :class:`~wbfe.options.ScoreOptions`), with
    :func:`planning_min_eigs`; the role the checkpoint's own description gives a weight (a MoE router or experts
    module) wins over the name rules'."""
    min_eigs = planning_min_eigs(options)
    for entry, consumed in entries(source):
        plan = plan_entry(entry, consumed, conv=options.conv, min_eigs=min_eigs, pattern=options.pattern)
        if isinstance(plan, MatrixPlan) and (description := getattr(source, "description", None)) is not None:
            role = description.role_of(plan.name)
            if role is not None and role != plan.role:
                plan = dataclasses.replace(plan, role=role)
        yield PlannedEntry(entry, plan)


def matrices_of(tensor: Any, plan: MatrixPlan, *, ww_slices: bool = False) -> list[Any]:
    """The matrices a planned tensor is analysed as: :func:`wbfe.engine.matrices.as_matrices` (for ``fft``, the kernel
    itself), or with ``ww_slices`` (``Conventions.ww_slices``) and ``slices`` WeightWatcher's own conv slices."""
    if not (ww_slices and plan.convention == "slices" and len(plan.shape) == 4):
        return as_matrices(tensor, plan)
    return list(ww_conv2d_matrices(ww_float32(to_numpy(tensor), "conv2d slice view")))
