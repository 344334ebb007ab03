"""Render results as text: tables, CSV and JSON-ready data. Text from a checkpoint goes through
:func:`printable` on its way to a table or CSV cell: a name holding an escape sequence must not drive
the user's terminal."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import Counter
from typing import Any, Iterable, Optional, Protocol, Sequence

from wbfe.errors import clip, printable

__all__ = ["ToJson", "json_ready", "format_value", "short_value", "text_table", "score_table", "score_csv", "as_float",
           "finite_or_none", "number_text", "is_number", "printable", "applicability_line", "skipped_line",
           "shape_text", "LINE_LIMIT"]

_TABLE_COLUMNS = (
    "name", "role", "shape", "gamma", "form", "bfe",
    "bfe_base", "bfe_merged", "d_bfe", "rel_frobenius",  # an adapter scored with --base: its merged modules
    "alpha", "alpha_weighted", "log_norm", "stable_rank",
    "htmp_kappa", "htmp_beta", "h", "h_star", "diagnosis",
)
# summary values not printed when there is none (an untrained adapter has no largest update)
_NONE_UNSHOWN = ("largest_update", "largest_update_frobenius_norm")


class _HasDict(Protocol):
    def to_dict(self) -> Any: ...


class ToJson:
    """``to_json`` for a result whose ``to_dict`` holds no NaN or Infinity (written as null there)."""

    def to_json(self: _HasDict, indent: Optional[int] = 2) -> str:
        """Standard JSON (non-finite numbers written as null)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def json_ready(obj: Any) -> Any:
    """``obj`` with tuples as lists, numpy scalars and arrays as Python values, and non-finite floats
    as None, so standard JSON can hold it.

    >>> import numpy as np
    >>> json_ready({"a": np.array([1.0, np.nan]), "b": (np.int64(2), float("inf"))})
    {'a': [1.0, None], 'b': [2, None]}
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):  # without importing numpy here
        return json_ready(obj.tolist())
    return obj


def shape_text(shape: Iterable[Any]) -> str:
    """A shape as the tables and figures write it, ``64x3x3`` (each part printable)."""
    return "x".join(printable(str(v)) for v in shape)


def format_value(value: Any) -> str:
    """Compact, table-friendly text for one cell."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}" if (abs(value) >= 1e4 or (value != 0 and abs(value) < 1e-3)) else f"{value:.4f}"
    if isinstance(value, (list, tuple)):
        return shape_text(value)
    return printable(str(value))  # also True, nan, inf


def short_value(value: Any) -> str:
    """One value in a result's ``repr``: a float to 6 significant digits, text quoted."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return repr(value) if isinstance(value, str) else str(value)


def text_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A fixed-width table of ``columns`` from ``rows`` (numbers right-aligned)."""
    cells = [[format_value(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row.get(c), (int, float)) or row.get(c) is None for row in rows) for c in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    return "\n".join([line(list(columns)), line(["-" * w for w in widths])] + [line(r) for r in cells])


#: The longest line the tables print for a person (a name, a reason, a list of skips), in characters.
LINE_LIMIT = 250
# An operator's or node's position inside a skip reason ("consumed by CONV_2D #12 input 2"): it
# tells the tensors apart in the JSON, and keeps equal reasons from grouping in the table.
_POSITIONS = re.compile(r"\s*\([^()]*#\d+[^()]*\)")


def score_table(result: Any, *, verbose: bool = False, width: Optional[int] = None) -> str:
    """The ``wbfe score`` table: one line per matrix, then the summary and the skip count.

    Args:
        verbose: the applicability line with its full reasons (else its one-sentence summary).
        width: the terminal's width, where the table goes to one: longer tensor names are
            shortened in the middle to fit it (else printed whole).
    """
    present = [c for c in _TABLE_COLUMNS if any(c in layer for layer in result.layers)]
    layers = _fit_names(result.layers, present, width)
    parts = [f"model: {printable(str(result.model.get('source')))}  ({result.model.get('format')}, sha256 "
             f"{str(result.model.get('sha256'))[:12]})", "", text_table(layers, present), ""]
    summary = [{"metric": k, "value": v} for k, v in result.summary.items()
               if not k.endswith("_n") and not isinstance(v, dict)  # by_role/by_component: JSON only
               and not (k in _NONE_UNSHOWN and (v is None or v != v))]
    parts.append(text_table(summary, ("metric", "value")))
    verdict = result.summary.get("bfe_applicability")
    if isinstance(verdict, dict):
        parts.append(applicability_line(verdict, verbose=verbose))
    # The notes of --intra (its product rows are in the table, not in the means above) and of dead units.
    for key, label in (("intra", "intra"), ("dead_units", "dead units")):
        if isinstance(note := result.summary.get(key), dict):
            parts.append(f"{label}: {printable(str(note.get('note')))}")
    if result.skipped:
        parts += ["", skipped_line(result.skipped)]
    return "\n".join(parts) + "\n"


def skipped_line(skipped: Sequence[dict[str, Any]], verb: str = "skipped", noun: str = "tensor") -> str:
    """One line counting the skipped tensors by reason (positions inside a reason left to the JSON),
    the most common first, within :data:`LINE_LIMIT`."""
    reasons = Counter(_POSITIONS.sub("", str(skip["reason"]).split(":")[0]).strip() for skip in skipped)
    n = len(skipped)
    head, tail = f"{verb} {n} {noun}{'s' * (n != 1)}: ", " (see --format json for each)"
    parts = [f"{n} {printable(clip(reason, 80))}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    shown = len(parts)
    while shown > 1 and len(head + ", ".join(parts[:shown]) + f", and {len(parts)} other reasons" + tail) > LINE_LIMIT:
        shown -= 1
    others = len(parts) - shown
    more = f", and {others} other reason{'s' if others > 1 else ''}" if others else ""
    return head + ", ".join(parts[:shown]) + more + tail


def _fit_names(rows: Sequence[dict[str, Any]], columns: Sequence[str], width: Optional[int]) -> Sequence[dict]:
    """``rows`` with names longer than the terminal leaves room for shortened in the middle."""
    if width is None or "name" not in columns:
        return rows
    others = [c for c in columns if c != "name"]
    used = sum(max([len(c)] + [len(format_value(r.get(c))) for r in rows]) + 2 for c in others)
    room = max(24, width - used)
    keep = room - 1  # characters around the "…"
    return [{**r, "name": n[:(keep + 1) // 2] + "…" + n[len(n) - keep // 2:]} if len(n) > room else r
            for r, n in zip(rows, (str(r.get("name")) for r in rows))]


def applicability_line(verdict: dict[str, Any], *, verbose: bool = True) -> str:
    """The text line for ``summary.bfe_applicability``: the status, then its reasons (``verbose``) or
    their one-sentence summary."""
    status = f"bfe applicability: {printable(str(verdict.get('status')))}"
    if not verbose and verdict.get("summary"):
        return f"{status} — {printable(str(verdict['summary']))} (--verbose: the reasons)"
    reasons = "; ".join(printable(str(r)) for r in verdict.get("reasons") or [])
    return status + (f" — {reasons}" if reasons else "")


def score_csv(result: Any) -> str:
    """One CSV row per matrix with every column (reasons joined as ``column: reason``), then the
    model's BFE-W applicability (``bfe_applicability``, its reasons joined with "; ") on every row:
    a CSV has no summary block, and a reader filtering rows must still see whether BFE-W applies."""
    columns = list(dict.fromkeys(k for layer in result.layers for k in layer))
    verdict = result.summary.get("bfe_applicability")
    model_columns = ({"bfe_applicability": str(verdict.get("status")),
                      "bfe_applicability_reasons": "; ".join(str(r) for r in verdict.get("reasons") or [])}
                     if isinstance(verdict, dict) else {})
    columns += [c for c in model_columns if c not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[printable(c) for c in columns], lineterminator="\n")
    writer.writeheader()
    for layer in result.layers:
        row = {**layer, "shape": shape_text(layer["shape"]), **model_columns,
               "reasons": "; ".join(f"{k}: {v}" for k, v in layer.get("reasons", {}).items())}
        writer.writerow({k: "" if isinstance(v, float) and math.isnan(v) else printable(v) if isinstance(v, str) else v
                         for k, v in row.items()})
    return buffer.getvalue()


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_float(value: Any) -> float:
    """A number as a float; NaN for None, text, booleans or anything else that is not a number."""
    return float(value) if is_number(value) else math.nan


def finite_or_none(value: Any) -> "float | None":
    """A finite number as a float; None for anything :func:`as_float` makes NaN, and for ±inf."""
    number = as_float(value)
    return number if math.isfinite(number) else None


def number_text(value: Any, spec: str, missing: str = "n/a") -> str:
    """``value`` formatted with ``spec``; ``missing`` for anything :func:`finite_or_none` makes None."""
    number = finite_or_none(value)
    return missing if number is None else format(number, spec)
