"""A checkpoint's finished score: :class:`ModelScore`, and :func:`finish`, which checks that
anything was scored and computes the summary (the head, per-model and per-role means)."""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from wbfe.framework.applicability import applicability
from wbfe.engine.heads import choose_head
from wbfe.engine.products import INTRA
from wbfe._deps import require
from wbfe.errors import NoUsableMatrixError
from wbfe.framework import FrameworkDescription, order_rows
from wbfe.render.text import ToJson, as_float, json_ready, short_value

__all__ = ["ModelScore", "finish", "column_mean"]


@dataclass
class ModelScore(ToJson):
    """The scores of one checkpoint.

    Attributes:
        model: provenance: source, format, files, sha256, versions, options.
        layers: one dict per analysed matrix: name, role, shape, dtype, convention, rows, cols,
            n_slices, n_eigs, gamma, form, then each metric group's columns, and ``reasons`` for NaNs.
        skipped: ``{"name", "reason", "shape", "dtype"}`` for every tensor not analysed.
        summary: head, head and mean values of the main columns (``bfe_head``, ``bfe_mean``, ...).
    """

    model: dict[str, Any]
    layers: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (the JSON shape); non-finite numbers become None."""
        return json_ready({"model": self.model, "layers": self.layers, "skipped": self.skipped, "summary": self.summary})

    def to_pandas(self) -> Any:
        """One row per analysed matrix (requires pandas)."""
        pd = require("pandas", "to_pandas() needs pandas (pip install pandas)")
        return pd.DataFrame([{k: (v if not isinstance(v, (list, dict)) else json.dumps(v)) for k, v in layer.items()}
                             for layer in self.layers])

    def _headline(self) -> list[tuple[str, Any]]:
        """The summary numbers a reader looks at first, in display order."""
        keys = ("head", "head_source", "bfe_head", "bfe_mean", "alpha_mean", "h_head")
        shown = [(k, self.summary[k]) for k in keys if k in self.summary]
        verdict = self.summary.get("bfe_applicability")
        if isinstance(verdict, dict):  # the status only: its reasons are long (summary has them)
            shown.append(("bfe_applicability", verdict.get("status")))
        return shown

    def __repr__(self) -> str:
        # A notebook shows this: a line, not the 56 KB of every row (to_dict() has them).
        fields = ", ".join(f"{k}={short_value(v)}" for k, v in self._headline())
        return (f"ModelScore(source={self.model.get('source')!r}, layers={len(self.layers)}, "
                f"skipped={len(self.skipped)}" + (f", {fields}" if fields else "") + ")")

    def _repr_html_(self) -> str:
        cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(short_value(v))}</td></tr>"
                        for k, v in [("source", self.model.get("source")), ("layers", len(self.layers)),
                                     ("skipped", len(self.skipped)), *self._headline()])
        return f"<table><caption>ModelScore</caption>{cells}</table>"


def finish(model: dict[str, Any], layers: list[dict[str, Any]], skipped: list[dict[str, Any]], groups: tuple[Any, ...],
           *, head: Optional[str] = None, head_hint: Optional[str] = None,
           config: Optional[dict[str, Any]] = None, description: Optional[FrameworkDescription] = None,
           allow_empty: bool = False) -> ModelScore:
    """The :class:`ModelScore` of rows made by :func:`wbfe.engine.run`: rows in the model's own order where the
    ``description`` gives one, else in stored order, and their summary (docs/metrics.md, Summary): the head (its row's
    role becomes ``head``; ``head`` the user's choice), each summary column's head value, mean and count, and means per
    role and component; the rows of products (role ``intra``) are left out of all but ``by_role["intra"]``. Raises
    NoUsableMatrixError when every tensor was skipped (unless ``allow_empty``: rows a caller adds to others)."""
    if not layers and not allow_empty:
        source, reasons = model["source"], "; ".join(f"{s['name']}: {s['reason']}" for s in skipped[:3])
        count = (f"{len(skipped)} tensor{'' if len(skipped) == 1 else 's'} skipped — {reasons}" if skipped
                 else "no weight tensor at all")
        raise NoUsableMatrixError(f"{source}: no usable weight matrix ({count})", ref=source)
    if description is not None:
        layers = _with_products(layers, description.order, description.aliases)
        skipped = order_rows(skipped, description.order, description.aliases)
    products = [layer for layer in layers if layer.get("role") == INTRA]
    every, layers = layers, [layer for layer in layers if layer.get("role") != INTRA]
    by_name = {layer["name"]: layer for layer in layers}
    choice = choose_head(layers, skipped, override=head, hint=head_hint, config=config, description=description)
    head = choice.name
    if head is not None:
        by_name[head]["role"] = "head"
    summary: dict[str, Any] = {"head": head, "head_source": choice.source, "n_layers": len(layers)}
    columns = [column for group in groups for column in group.summary_columns]
    for column in columns:
        summary[f"{column}_head"] = as_float(by_name[head].get(column)) if head else math.nan
        summary[f"{column}_mean"], summary[f"{column}_n"] = column_mean(layers, column)
    summary["by_role"] = _means_by(every, "role", columns)
    if products:
        summary["intra"] = {"n": len(products), "note": (
            f"{len(products)} product(s) of consecutive weight matrices (WeightWatcher's intra=True) included "
            "as rows with role 'intra'; the head and the model's means leave them out, by_role['intra'] has theirs")}
    elif (model.get("options") or {}).get("intra"):
        summary["intra"] = {"n": 0, "note": "--intra: no product of consecutive weight matrices was scored (no two "
                                            "consecutive ones share a side, a factor is non-finite or all zero, or "
                                            "the sparsify product is below float64's range)"}
    if dead := [layer for layer in every if layer.get("dead_rows") or layer.get("dead_cols")]:
        listed = ", ".join(f"{layer['name']} ({layer.get('dead_rows') or 0} rows, {layer.get('dead_cols') or 0} cols)"
                           for layer in dead[:5]) + (f" and {len(dead) - 5} more" if len(dead) > 5 else "")
        summary["dead_units"] = {"n": len(dead), "note": (
            f"{len(dead)} matrix(es) with exactly-zero rows or columns (dead or pruned units): {listed}; "
            "BFE-W and the spectrum columns are of each one's live part (dead_rows, dead_cols in the rows)")}
    if any(layer.get("component") for layer in layers):
        summary["by_component"] = _means_by(layers, "component", columns)
    if unsplit := [layer["name"] for layer in layers if _UNSPLIT.search(layer["name"])]:
        summary["experts_note"] = (f"{len(unsplit)} fused gate_up expert matrices of a model type without a known "
                                   "gate/up layout are scored unsplit (gate and up as one matrix)")
    summary["bfe_applicability"] = applicability(description, config)
    if choice.note is not None:  # where no head is found, choose_head always says why
        summary["head_note"] = choice.note
    return ModelScore(model=model, layers=every, skipped=skipped, summary=summary)


def _with_products(layers: list[dict[str, Any]], order: Sequence[str],
                   aliases: Mapping[str, str]) -> list[dict[str, Any]]:
    """The matrices' rows in ``order``, each product's row (``"<first> X <second>"``) right after its second
    matrix's row (after the row it followed in the stream if that one has none)."""
    after: dict[Optional[str], list[dict[str, Any]]] = {}
    previous: Optional[str] = None
    names = {layer["name"] for layer in layers if layer.get("role") != INTRA}
    for layer in layers:
        if layer.get("role") == INTRA:
            second = layer["name"].rpartition(" X ")[2]
            after.setdefault(second if second in names else previous, []).append(layer)
        else:
            previous = layer["name"]
    out = list(after.get(None, []))
    for layer in order_rows([layer for layer in layers if layer.get("role") != INTRA], order, aliases):
        out.append(layer)
        out.extend(after.get(layer["name"], []))
    return out


_UNSPLIT = re.compile(r"(gate_up|input_linear|w13|w1_w3)[^.]*\[\d+\]$")


def _means_by(layers: list[dict[str, Any]], key: str, columns: list[str]) -> dict[str, dict[str, Any]]:
    """Per value of ``key`` (each role, or each component), ``n`` and the mean of each column over
    its matrices with a finite value: thousands of expert rows do not drown the attention's mean."""
    out: dict[str, dict[str, Any]] = {}
    for value in dict.fromkeys(str(layer.get(key)) for layer in layers if layer.get(key)):
        members = [layer for layer in layers if str(layer.get(key)) == value]
        out[value] = {"n": len(members), **{f"{column}_mean": column_mean(members, column)[0] for column in columns}}
    return out


def column_mean(rows: Sequence[dict[str, Any]], column: str) -> tuple[float, int]:
    """The mean of ``column``'s finite values over ``rows`` (NaN where there is none), and their count."""
    values = np.array([as_float(row.get(column)) for row in rows], dtype=float)
    finite = values[np.isfinite(values)]
    return (float(finite.mean()) if finite.size else math.nan), int(finite.size)
