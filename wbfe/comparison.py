"""Compare two checkpoints matrix by matrix: what changed, where, and by how much.

(Named `comparison` so that the module never shadows the function `wbfe.compare`.)

Both checkpoints are streamed side by side (:func:`wbfe.sources.open_source`) and their tensors
matched by name, after optional ``REGEX=REPL`` renames applied to A's names; each tensor is read
once. Per matched matrix (conv kernels flattened to out × in·k·k, any float dtype, quantised
tensors once their reader dequantises them):

- ``rel_frobenius`` = ‖B − A‖_F / ‖A‖_F;
- each metric of the chosen groups on A and on B (``<col>_a``, ``<col>_b``) and its change
  ``d_<col>`` = B − A;
- ``w1_log_eigs``: Wasserstein-1 distance between the distributions of log e of the two spectra;
- ``stable_rank_delta``: ‖B − A‖_F² / ‖B − A‖₂², how many directions the change spreads over;
- ``overlap_in`` / ``overlap_out``: ‖V_Aᵀ V_B‖_F² / k for the top-k right (input-side) and left
  (output-side) singular vectors: 1 when the k leading directions are the same, ≈ k/n for random ones.

Pairs are computed side by side on worker threads (one per CPU), each on one BLAS thread
(``spectra.pin_threads``): on a shared two-core machine LAPACK's eigen-solvers on two threads ran
5-40x slower than on one.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from wbfe._provenance import installed_versions
from wbfe.errors import InvalidOptionError, NoUsableMatrixError
from wbfe.matrices import MatrixPlan, Skip, as_matrices, find_head, plan_matrix
from wbfe.metrics import MetricOptions, resolve_groups
from wbfe.metrics.bfe import parse_lambda
from wbfe.metrics.rand import log_spectrum_distance
from wbfe.pipeline import worker_count
from wbfe.report import json_ready
from wbfe.sources import TensorEntry, open_source
from wbfe.sources.peft_adapter import AdapterSource
from wbfe.spectra import DegenerateMatrixError, pin_threads, resolve_device

__all__ = ["Comparison", "compare", "parse_name_map", "subspace_overlap", "top_singular"]

# How many of the most-changed matrices the summary names.
_MOST_CHANGED = 5


@dataclass
class Comparison:
    """The comparison of checkpoint B against checkpoint A.

    Attributes:
        model_a, model_b: provenance of each (source, format, files, sha256).
        options: the settings used; ``versions`` of the packages.
        layers: one dict per matched matrix (see the module docstring for the columns).
        unmatched: ``{"name", "side", "reason"}`` for every tensor with no counterpart.
        skipped: ``{"name", "name_b", "reason", ...}`` for matched tensors that are not matrices or
            cannot be compared (1-D, integer, all zero, ...).
        summary: counts, means, and the names of the matrices that changed most.
    """

    model_a: dict[str, Any]
    model_b: dict[str, Any]
    options: dict[str, Any]
    layers: list[dict[str, Any]] = field(default_factory=list)
    unmatched: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the JSON shape); non-finite numbers become None."""
        return json_ready({"model_a": self.model_a, "model_b": self.model_b, "options": self.options,
                           "layers": self.layers, "unmatched": self.unmatched, "skipped": self.skipped,
                           "summary": self.summary})

    def to_json(self, indent: Optional[int] = 2) -> str:
        """Standard JSON (non-finite numbers written as null, with a reason beside them)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_pandas(self) -> Any:
        """One row per matched matrix (requires pandas), as :meth:`wbfe.ModelScore.to_pandas` builds it."""
        from wbfe.scoring import ModelScore

        return ModelScore(model={}, layers=self.layers).to_pandas()


def parse_name_map(pairs: Union[None, str, Iterable[Union[str, tuple[str, str]]]]) -> list[tuple[re.Pattern[str], str]]:
    """``["REGEX=REPL", (regex, repl), ...]`` as compiled renames (split at the last ``=``).

    Raises:
        InvalidOptionError: no ``=``, an empty pattern or an invalid regular expression.
    """
    if pairs is None:
        return []
    items = [pairs] if isinstance(pairs, str) else list(pairs)
    out = []
    for item in items:
        if isinstance(item, str):
            pattern, sep, repl = item.rpartition("=")
            if not sep:
                raise InvalidOptionError(f"--map must be REGEX=REPLACEMENT, not {item!r}")
        else:
            pattern, repl = item
        if not pattern:
            raise InvalidOptionError(f"--map {item!r} has an empty pattern")
        try:
            out.append((re.compile(pattern), repl))
        except re.error as exc:
            raise InvalidOptionError(f"--map {pattern!r} is not a valid regular expression: {exc}") from None
    return out


def top_singular(matrix: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(U_k, s_k, V_k)``: the k largest singular values of a float64 matrix, descending, and
    their left and right singular vectors (columns); k is cut to the number of nonzero ones.

    From the top-k eigenvectors of the smaller Gram matrix (LAPACK's subset eigen-solver), the
    other side as M·v / s: a dense SVD of a 1,024 × 256 matrix took 0.1 s on one thread and 2-6 s
    on two busy ones, while the Gram route is a product and a partial eigen-solve.
    """
    from scipy.linalg import eigh

    rows, cols = matrix.shape
    wide = rows <= cols
    gram = matrix @ matrix.T if wide else matrix.T @ matrix
    p = gram.shape[0]
    k = min(k, p)
    values, vectors = eigh(gram, subset_by_index=[p - k, p - 1], check_finite=False, overwrite_a=True)
    values, vectors = values[::-1], vectors[:, ::-1]
    # Below p·eps·λ_max an eigenvalue of the Gram matrix is rounding (as in wbfe.spectra).
    keep = values > max(values[0], 0.0) * p * np.finfo(np.float64).eps
    s = np.sqrt(values[keep])
    vectors = vectors[:, keep]
    other = (matrix.T @ vectors if wide else matrix @ vectors) / s
    return (vectors, s, other) if wide else (other, s, vectors)


def subspace_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """‖aᵀb‖_F² / k for two matrices of k orthonormal columns each (the first k of either, when
    one has more): the mean squared cosine of the principal angles between their spans (1
    identical, 0 orthogonal)."""
    k = min(a.shape[1], b.shape[1])
    return float(np.sum((a[:, :k].T @ b[:, :k]) ** 2) / k) if k else math.nan


def compare(
    a: Any,
    b: Any,
    *,
    metrics: Union[str, Iterable[str], None] = None,
    name_map: Union[None, str, Iterable[Union[str, tuple[str, str]]]] = None,
    top_k: int = 10,
    layers: Optional[str] = None,
    lam: Union[str, float] = "opt",
    device: str = "auto",
    min_eigs: int = 10,
    seed: int = 0,
) -> Comparison:
    """Compare checkpoint ``b`` against checkpoint ``a``, matrix by matrix.

    Args:
        a, b: any references :func:`wbfe.score` accepts (paths, hub ids, modules, state dicts).
        metrics: metric groups whose change is reported (default ``bfe,htsr``).
        name_map: renames ``REGEX=REPL`` (or ``(regex, repl)``) applied in order to A's names
            before matching them with B's.
        top_k: size of the singular subspaces whose overlap is reported.
        layers: only tensors whose (A) name matches this regular expression.
        lam, device, min_eigs, seed: as for :func:`wbfe.score`.

    Raises:
        InvalidOptionError: a bad option value, or a LoRA adapter folder (its tensors are factors).
            The errors of :func:`wbfe.sources.open_source`.
        NoUsableMatrixError: no matrix of A has a comparable counterpart in B.

    Example:
        >>> import torch, wbfe
        >>> w = torch.eye(12)
        >>> c = wbfe.compare({"fc.weight": w}, {"fc.weight": 2 * w}, metrics="bfe")
        >>> c.layers[0]["rel_frobenius"], c.layers[0]["d_bfe"]
        (1.0, 0.0)
    """
    from wbfe.scoring import _spectrum_job

    groups = resolve_groups(metrics)
    renames = parse_name_map(name_map)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InvalidOptionError(f"top_k must be a positive integer, not {top_k!r}")
    if not isinstance(min_eigs, int) or min_eigs < 1:
        raise InvalidOptionError(f"min_eigs must be a positive integer, not {min_eigs!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidOptionError(f"seed must be a non-negative integer, not {seed!r}")
    try:
        pattern = re.compile(layers) if layers else None
    except re.error as exc:
        raise InvalidOptionError(f"--layers is not a valid regular expression: {exc}") from None
    lam_value = parse_lambda(lam)
    torch_device = resolve_device(device)
    metric_options = MetricOptions(lam=lam_value, seed=seed)
    options = {"metrics": [g.name for g in groups], "map": [[p.pattern, r] for p, r in renames], "top_k": top_k,
               "layers": layers, "lambda": lam_value, "device": device, "min_eigs": min_eigs, "seed": seed,
               "conv": "flatten"}
    result = Comparison(model_a={}, model_b={}, options=options)

    def side(entry: TensorEntry, plan: MatrixPlan, tensor: Any, label: str) -> Any:
        """The entry's spectrum (with every group's extras), or why it cannot be compared."""
        outcome = _spectrum_job(as_matrices(tensor, plan), torch_device, True, groups, metric_options, entry.name)()
        return f"{label}: {outcome}" if isinstance(outcome, DegenerateMatrixError) else outcome

    def pair(entry_a: TensorEntry, entry_b: TensorEntry, plan_a: MatrixPlan, plan_b: MatrixPlan, tensor_a: Any,
             tensor_b: Any, base: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """``(True, row)`` for a compared pair, ``(False, skip)`` when either side has no spectrum."""
        got_a, got_b = side(entry_a, plan_a, tensor_a, "A"), side(entry_b, plan_b, tensor_b, "B")
        if isinstance(got_a, str) or isinstance(got_b, str):
            return False, {**base, "reason": "; ".join(g for g in (got_a, got_b) if isinstance(g, str))}
        return True, {**base, **_change(tensor_a, tensor_b, plan_a, got_a, got_b, groups, metric_options, top_k)}

    def collect(future: "Future[tuple[bool, dict[str, Any]]]") -> None:
        compared, row = future.result()
        (result.layers if compared else result.skipped).append(row)

    # Pairs are computed side by side on worker threads, every BLAS pool held at one thread (their
    # products and eigen-solves release the GIL; on two busy threads LAPACK's eigen-solvers ran 5-40x
    # slower than on one), rows kept in stream order.
    workers = worker_count(torch_device)
    in_flight: collections.deque[Future[tuple[bool, dict[str, Any]]]] = collections.deque()
    with open_source(a) as source_a, open_source(b) as source_b, pin_threads(), \
            ThreadPoolExecutor(workers, thread_name_prefix="wbfe-compare") as pool:
        for source in (source_a, source_b):
            if isinstance(source, AdapterSource):  # its tensors are factors, not the matrices they change
                raise InvalidOptionError(f"{source.provenance.source} is a LoRA adapter: compare full checkpoints, "
                                         "or score the adapter with --base to see its change against the base")
        stream_a = _dense_entries(source_a, "a", result.skipped)
        stream_b = _dense_entries(source_b, "b", result.skipped)
        for entry_a, entry_b, why in _pairs(stream_a, stream_b, renames, pattern):
            if entry_a is None or entry_b is None:
                only = entry_a if entry_a is not None else entry_b
                assert only is not None
                result.unmatched.append({"name": only.name, "side": "a" if entry_b is None else "b", "reason": why})
                continue
            base: dict[str, Any] = {"name": entry_a.name, "name_b": entry_b.name, "shape": list(entry_a.shape),
                    "dtype_a": entry_a.dtype, "dtype_b": entry_b.dtype}
            if why:
                result.skipped.append({**base, "reason": why})
                continue
            if entry_a.shape != entry_b.shape:
                result.skipped.append({**base, "shape_b": list(entry_b.shape),
                                       "reason": f"shape differs: A {list(entry_a.shape)}, B {list(entry_b.shape)}"})
                continue
            plan_a, plan_b = _plan(entry_a, min_eigs), _plan(entry_b, min_eigs)
            if isinstance(plan_a, Skip) or isinstance(plan_b, Skip):
                reason = "; ".join(f"{lab}: {p.reason}" for lab, p in (("A", plan_a), ("B", plan_b)) if isinstance(p, Skip))
                result.skipped.append({**base, "reason": reason})
                continue
            base.update({"quant_a": entry_a.quant, "quant_b": entry_b.quant, "role": plan_a.role,
                         "rows": plan_a.rows, "cols": plan_a.cols, "depth": _depth(entry_a.name)})
            job = functools.partial(pair, entry_a, entry_b, plan_a, plan_b, entry_a.load(), entry_b.load(), base)
            in_flight.append(pool.submit(job))
            while len(in_flight) > workers:  # at most one pair waiting beside those being computed
                collect(in_flight.popleft())
        while in_flight:
            collect(in_flight.popleft())
        result.model_a = source_a.provenance.to_dict()
        result.model_b = source_b.provenance.to_dict()
    result.options["versions"] = installed_versions()
    result.options["device"] = str(torch_device)
    if not result.layers:
        raise NoUsableMatrixError(
            f"no matrix of {result.model_a.get('source')} has a comparable counterpart in {result.model_b.get('source')} "
            f"({len(result.unmatched)} unmatched, {len(result.skipped)} skipped)"
        )
    result.summary = _summarise(result, groups)
    return result


def _pairs(
    stream_a: Iterator[TensorEntry],
    stream_b: Iterator[TensorEntry],
    renames: Sequence[tuple[re.Pattern[str], str]],
    pattern: Optional[re.Pattern[str]],
) -> Iterator[tuple[Optional[TensorEntry], Optional[TensorEntry], str]]:
    """``(a, b, "")`` for each matched pair, ``(a, None, why)`` / ``(None, b, why)`` for the others,
    ``(a, b, why)`` for a pair left out by ``--layers``.

    The two streams advance in step; an entry waits (by name, nothing read) only until its
    counterpart arrives, so checkpoints stored in the same order hold almost nothing back.
    """
    waiting_a: dict[str, TensorEntry] = {}
    waiting_b: dict[str, TensorEntry] = {}
    claimed: dict[str, str] = {}  # B name -> the A name matched (or waiting) for it
    a_done = b_done = False
    while not (a_done and b_done):
        if not a_done:
            entry_a = next(stream_a, None)
            if entry_a is None:
                a_done = True
            else:
                key = entry_a.name
                for regex, repl in renames:
                    key = regex.sub(repl, key)
                if key in claimed:
                    yield entry_a, None, f"maps to {key!r}, as {claimed[key]!r} already does"
                else:
                    claimed[key] = entry_a.name
                    if key in waiting_b:
                        yield _selected(entry_a, waiting_b.pop(key), pattern)
                    else:
                        waiting_a[key] = entry_a
        if not b_done:
            entry_b = next(stream_b, None)
            if entry_b is None:
                b_done = True
            elif entry_b.name in waiting_a:
                yield _selected(waiting_a.pop(entry_b.name), entry_b, pattern)
            else:
                waiting_b[entry_b.name] = entry_b
    for key, entry in waiting_a.items():
        yield entry, None, f"no tensor {key!r} in B" + ("" if key == entry.name else " (after --map)")
    for entry in waiting_b.values():
        yield None, entry, "no tensor of A maps to this name"


def _dense_entries(source: Any, side: str, skipped: list[dict[str, Any]]) -> Iterator[TensorEntry]:
    """The source's tensors as ``wbfe score`` sees them (quantised weights dequantised, fused expert
    stacks split); what a quantised weight consumes (its scales, zeros) is listed in ``skipped``."""
    from wbfe.scoring import _stream

    for entry, consumed in _stream(source):
        if consumed is None:
            yield entry
        else:
            skipped.append({"name": entry.name, "side": side, "shape": list(entry.shape), "reason": consumed})


def _plan(entry: TensorEntry, min_eigs: int) -> Union[MatrixPlan, Skip]:
    if entry.skip is not None:  # the reader could not give it as a dense tensor
        return Skip(entry.name, entry.skip, entry.shape, entry.dtype)
    return plan_matrix(entry.name, entry.shape, entry.dtype, conv="flatten", min_eigs=min_eigs)


def _selected(a: TensorEntry, b: TensorEntry, pattern: Optional[re.Pattern[str]]) -> tuple[TensorEntry, TensorEntry, str]:
    return a, b, "" if pattern is None or pattern.search(a.name) else "not selected by --layers"


def _float64(tensor: Any, plan: MatrixPlan, *, copy: bool = False) -> np.ndarray:
    """The matrix in float64 on the CPU; ``copy``: never the caller's own storage (a float64 tensor
    would otherwise come back as it is)."""
    import torch

    return tensor.detach().reshape(plan.rows, plan.cols).to(device="cpu", dtype=torch.float64, copy=copy).numpy()


def _change(
    tensor_a: Any, tensor_b: Any, plan: MatrixPlan, spec_a: Any, spec_b: Any, groups: tuple[Any, ...],
    metric_options: MetricOptions, top_k: int,
) -> dict[str, Any]:
    row: dict[str, Any] = {"n_eigs": spec_a.n_eigs, "gamma": spec_a.gamma, "form": spec_a.form}
    reasons: dict[str, str] = {}
    for group in groups:
        out_a, out_b = group.compute(spec_a, metric_options), group.compute(spec_b, metric_options)
        for column in group.columns:
            va, vb = out_a.values.get(column), out_b.values.get(column)
            row[f"{column}_a"], row[f"{column}_b"] = va, vb
            if column in out_a.reasons or column in out_b.reasons:
                row[f"d_{column}"] = math.nan
                reasons[f"d_{column}"] = "; ".join(f"{lab}: {o.reasons[column]}" for lab, o in (("A", out_a), ("B", out_b))
                                                   if column in o.reasons)
            elif _is_number(va) and _is_number(vb):
                row[f"d_{column}"] = float(vb) - float(va)
                if not math.isfinite(row[f"d_{column}"]):
                    reasons[f"d_{column}"] = "not finite on one side"
        for column, why in out_a.reasons.items():
            reasons[f"{column}_a"] = why
        for column, why in out_b.reasons.items():
            reasons[f"{column}_b"] = why
    # Spectra scaled for float64's range (Spectrum.log_scale) are compared in true units.
    row["w1_log_eigs"] = log_spectrum_distance(spec_a.eigs, spec_b.eigs, shift=spec_b.log_scale - spec_a.log_scale)
    # Both copies are scaled by one power of two where their entries are far from 1, so that Gram
    # matrices and norms stay inside float64's range; only the absolute norms are scaled back.
    a64 = _float64(tensor_a, plan, copy=True)
    b64 = _float64(tensor_b, plan, copy=True)  # overwritten by B − A below
    biggest = max(float(np.max(np.abs(a64))), float(np.max(np.abs(b64))))
    factor = math.ldexp(1.0, -math.frexp(biggest)[1]) if not 1e-100 < biggest < 1e100 else 1.0
    if factor != 1.0:
        a64 *= factor
        b64 *= factor
    u_a, _, v_a = top_singular(a64, top_k)
    u_b, _, v_b = top_singular(b64, top_k)
    norm_a = float(np.linalg.norm(a64))
    b64 -= a64  # B − A, in place: two float64 copies at most
    del a64
    norm_d = float(np.linalg.norm(b64))
    row["frobenius_delta"] = norm_d / factor
    row["rel_frobenius"] = norm_d / norm_a
    if norm_d > 0.0:
        spectral_d = float(top_singular(b64, 1)[1][0])
        row["spectral_delta"] = spectral_d / factor
        row["stable_rank_delta"] = norm_d ** 2 / spectral_d ** 2
    else:
        row["spectral_delta"] = 0.0
        row["stable_rank_delta"] = math.nan
        reasons["stable_rank_delta"] = "B − A = 0: no change to take the rank of"
    row["top_k"] = min(u_a.shape[1], u_b.shape[1])
    row["overlap_in"] = subspace_overlap(v_a, v_b)
    row["overlap_out"] = subspace_overlap(u_a, u_b)
    row["reasons"] = reasons
    return row


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _depth(name: str) -> Optional[int]:
    """The block index in a tensor name (``model.layers.12.mlp...`` -> 12): its first integer part."""
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    return None


def _summarise(result: Comparison, groups: tuple[Any, ...]) -> dict[str, Any]:
    rows = result.layers
    names = [row["name"] for row in rows]
    head = find_head(names)
    by_name = {row["name"]: row for row in rows}

    def finite(column: str) -> np.ndarray:
        values = np.array([float(row.get(column, math.nan)) if _is_number(row.get(column)) else math.nan
                           for row in rows])
        return values[np.isfinite(values)]

    def ranked(column: str) -> list[dict[str, Any]]:
        scored = [(float(row[column]), row["name"]) for row in rows
                  if _is_number(row.get(column)) and math.isfinite(row[column])]
        scored.sort(key=lambda item: -item[0])
        return [{"name": name, column: value} for value, name in scored[:_MOST_CHANGED]]

    summary: dict[str, Any] = {
        "n_matched": len(rows),
        "n_skipped": len(result.skipped),
        "n_unmatched_a": sum(1 for u in result.unmatched if u["side"] == "a"),
        "n_unmatched_b": sum(1 for u in result.unmatched if u["side"] == "b"),
        "head": head,
    }
    for column in ("rel_frobenius", "w1_log_eigs", "overlap_in", "overlap_out"):
        values = finite(column)
        summary[f"{column}_mean"] = float(values.mean()) if values.size else math.nan
        summary[f"{column}_max"] = float(values.max()) if values.size else math.nan
    for group in groups:
        for column in group.summary_columns:
            values = finite(f"d_{column}")
            summary[f"d_{column}_mean"] = float(values.mean()) if values.size else math.nan
            summary[f"d_{column}_head"] = by_name[head].get(f"d_{column}", math.nan) if head else math.nan
    summary["most_changed"] = ranked("rel_frobenius")
    summary["most_changed_spectrum"] = ranked("w1_log_eigs")
    return summary
