"""Score a PEFT LoRA adapter: each adapted module as the one matrix it adds, ΔW = s·B·A, its spectrum
exactly from an r × r core (never the m × n product); with a base, each merged W₀ + ΔW beside W₀.
The columns and the mathematics: docs/adapters.md, docs/finetunes.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Any, Optional

import numpy as np

from wbfe import engine
from wbfe.comparison import pair_change
from wbfe.engine.heads import UNSELECTED
from wbfe.engine.matrices import Skip, find_head, role_of
from wbfe.engine.result import column_mean
from wbfe.errors import CorruptCheckpointError, InvalidOptionError, NoUsableMatrixError
from wbfe.framework import order_rows
from wbfe.linalg.arrays import to_numpy, to_torch
from wbfe.linalg.spectra import pin_threads
from wbfe.metrics.bfe import bfe
from wbfe.sources import TensorEntry, open_source, remote_ref
from wbfe.sources.peft_adapter import PREFIX, AdapterSource, LoraConfig

__all__ = ["LoraModule", "lora_factors", "core_singular_values", "delta_weight", "adapter_columns", "score_adapter"]

_FACTOR = re.compile(r"^(?P<module>.+)\.(?P<part>lora_A|lora_B)\.weight$")
_EMBED = re.compile(r"^(?P<module>.+)\.(?P<part>lora_embedding_A|lora_embedding_B)$")
_MAGNITUDE = re.compile(r"^(?P<module>.+)\.lora_magnitude_vector(\.weight)?$")
_EPS = float(np.finfo(np.float64).eps)
_SIDES = {"_a": "_base", "_b": "_merged"}  # wbfe compare's sides of a change, for W₀ → merged


@dataclass
class LoraModule:
    """The stored parts of one adapted module (its name as in the base model)."""

    name: str
    a: Optional[TensorEntry] = None
    b: Optional[TensorEntry] = None
    magnitude: Optional[TensorEntry] = None
    embedding: bool = False


def lora_factors(a: Any, b: Any, *, embedding: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(left, right)`` in float64 with ΔW = s·left·right laid out as the base weight is, before any
    ``fan_in_fan_out`` transpose: B and A, or for an embedding (PEFT adds (B·A)ᵀ) Aᵀ and Bᵀ."""
    a64, b64 = (to_numpy(x).astype(np.float64) for x in (a, b))
    if embedding:
        return a64.T, b64.T
    return b64.reshape(b64.shape[0], -1), a64.reshape(a64.shape[0], -1)


def core_singular_values(left: np.ndarray, right: np.ndarray, scale: float) -> np.ndarray:
    """Singular values of scale·left·right, descending, from the r × r core R_L R_Rᵀ (QR of left and of
    rightᵀ); values at the rounding level of the largest are set to 0."""
    # R alone (Q is never needed); numpy's stubs type every mode as returning (Q, R).
    r_left: np.ndarray = np.linalg.qr(left, mode="r")  # type: ignore[assignment]
    r_right: np.ndarray = np.linalg.qr(right.T, mode="r")  # type: ignore[assignment]
    s = np.linalg.svd(abs(scale) * (r_left @ r_right.T), compute_uv=False)
    if s.size and s[0] > 0.0:
        s[s <= s[0] * max(left.shape + right.shape) * _EPS] = 0.0
    return s


def delta_weight(left: np.ndarray, right: np.ndarray, scale: float, shape: tuple[int, ...], fan_in_fan_out: bool) -> np.ndarray:
    """The dense ΔW in the base weight's stored shape (for merging only)."""
    dense = scale * (left @ right)
    return (dense.T if fan_in_fan_out else dense).reshape(shape)


def adapter_columns(singular: np.ndarray, lam: Any, *, bfe_asked: bool = True) -> tuple[dict[str, Any], dict[str, str]]:
    """The columns of one adapted module from its singular values (descending); ``bfe`` and ``lambda`` (the bfe
    group's) only when ``bfe_asked``."""
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.sort(singular ** 2)
        values: dict[str, Any] = {"eigs": [float(x) for x in e], "frobenius_norm": float(math.sqrt(e.sum())),
                                  "spectral_norm": float(singular[0]) if singular.size else 0.0}
    reasons: dict[str, str] = {}
    columns: tuple[str, ...] = ("stable_rank", "effective_rank") + (("bfe", "lambda") if bfe_asked else ())
    if not np.isfinite(singular).all():
        columns += ("frobenius_norm", "spectral_norm")
        why = "ΔW's singular values are not finite (NaN or Inf in lora_A or lora_B, or B·A past float64's range)"
    elif not e.size or not e[-1] > 0.0:
        why = "ΔW = 0: B (or A) is all zero, as PEFT initialises it (an untrained adapter)"
    elif not np.isfinite(e).all():
        columns += ("frobenius_norm",)
        why = f"ΔW's singular values (up to {singular[0]:.3g}) square past float64's range"
    else:
        columns = ()
    if columns:
        return {**values, **dict.fromkeys(columns, math.nan)}, dict.fromkeys(columns, why)
    values["stable_rank"] = float(e.sum() / e[-1])
    p = singular[singular > 0.0] / singular.sum()
    values["effective_rank"] = float(math.exp(-np.sum(p * np.log(p))))
    if bfe_asked:
        values["bfe"], values["lambda"] = bfe(e, lam)
        if math.isinf(values["bfe"]):
            reasons["bfe"] = f"rank-deficient: {int(np.count_nonzero(e <= 0.0))} of the r singular values are 0"
    return values, reasons


def _module_parts(
    source: AdapterSource,
) -> tuple[dict[str, LoraModule], list[TensorEntry], list[dict[str, Any]], dict[str, str]]:
    """Adapted modules, tensors saved whole (``modules_to_save``), the tensors left out, and the reader's reason
    per LoRA factor it cannot give (``fc.lora_A``: a stride-0 view, a second state dict's)."""
    modules: dict[str, LoraModule] = {}
    whole: list[TensorEntry] = []
    skipped: list[dict[str, Any]] = []
    unread: dict[str, str] = {}
    for entry in source.entries():
        name = entry.name[len(PREFIX):] if entry.name.startswith(PREFIX) else entry.name
        factor = _FACTOR.match(name) or _EMBED.match(name)
        found = factor or _MAGNITUDE.match(name)
        if entry.skip is not None:  # listed with the reader's reason, never loaded (a stride-0 view stays a view)
            skipped.append(Skip(name, entry.skip, entry.shape, entry.dtype).to_dict())
            if factor is not None:
                unread[f"{factor['module']}.{factor['part'].replace('_embedding', '')}"] = entry.skip
        elif found is not None:
            module = modules.setdefault(found["module"], LoraModule(found["module"]))
            part = "magnitude" if factor is None else "a" if factor["part"].endswith("A") else "b"
            if getattr(module, part) is not None:  # e.g. saved with and without base_model.model.
                raise CorruptCheckpointError.at(source.provenance.source, f"module {found['module']!r} is stored "
                                                f"twice: {getattr(module, part).name} and {entry.name}")
            if factor is not None:
                module.embedding = factor["part"].startswith("lora_embedding")
            setattr(module, part, entry)
        elif ".lora_" in name:
            skipped.append({"name": entry.name, "reason": "LoRA tensor other than the factors (e.g. lora_B bias): not a matrix of ΔW",
                            "shape": list(entry.shape), "dtype": entry.dtype})
        else:
            whole.append(replace(entry, name=name))
    return modules, whole, skipped, unread


def score_adapter(source: Any, options: Any, *, base: Any = None, top_k: int = 10) -> Any:
    """The :class:`~wbfe.engine.ModelScore` of an opened adapter ``source`` (the caller closes it).

    Raises:
        InvalidOptionError: ``base`` given but ``source`` is not an adapter.
        CorruptCheckpointError: a module with one factor, factors that disagree with each other or the
            configured rank, or a base weight of another shape.
        NoUsableMatrixError: nothing to score.
    """
    context = engine.Context.of(options)
    if not isinstance(source, AdapterSource):
        raise InvalidOptionError(f"--base applies to a PEFT LoRA adapter folder (adapter_config.json); "
                                 f"{source.provenance.source} is not one")
    lora = source.lora
    modules, whole, skipped, unread = _module_parts(source)
    layers: list[dict[str, Any]] = []
    factors: dict[str, _Factors] = {}
    pattern = options.pattern
    # One BLAS thread: a thin QR is far slower on several busy threads than on one.
    with pin_threads():
        for name, module in modules.items():
            weight_name = f"{name}.weight"
            if pattern is not None and not pattern.search(weight_name):
                skipped.append({"name": weight_name, "reason": UNSELECTED, "shape": [], "dtype": ""})
                continue
            row, kept = _adapter_row(module, lora, source.provenance.source, context.metric_options,
                                     bfe_asked="bfe" in options.metrics, unread=unread)
            if base is not None:  # the factors are kept for merging only (2·(m + n)·r float64 each)
                factors[name] = kept
            layers.append(row)
    provenance = source.provenance.to_dict()
    if whole:
        with open_source({entry.name: to_torch(entry.load()) for entry in whole}) as saved_whole:
            # all skipped is no error here: a bias beside the modules; the adapter says so below if nothing is scored
            saved = engine.score_source(saved_whole, options, allow_empty=True)
        for row in saved.layers:
            row["kind"] = "modules_to_save"
        layers += saved.layers
        skipped += saved.skipped
    if base is not None:
        provenance["base"], order, aliases = _merge_with_base(base, layers, factors, lora, context, top_k,
                                                              stream=options.stream)
        layers = order_rows(layers, order, aliases)  # the base model's order (its description's, else its checkpoint's)
    provenance = engine.provenance_of(provenance, context)
    # an in-memory base is named by its source ('<dict>'), not by the repr of its every value
    named = None if base is None else str(base) if isinstance(base, (str, PurePath)) else provenance["base"]["source"]
    provenance["options"] = {**options.to_dict(), "base": named}
    if not layers:
        why = "; ".join(sorted({row["reason"] for row in skipped}))
        raise NoUsableMatrixError(f"{provenance['source']}: the adapter holds no LoRA module and nothing saved whole"
                                  if not skipped else f"{provenance['source']}: nothing scored ({len(skipped)} "
                                  f"tensor(s) left out: {why})")
    return engine.ModelScore(model=provenance, layers=layers, skipped=skipped, summary=_summarise(layers, context.groups, base is not None))


@dataclass(frozen=True)
class _Factors:
    """What merging one module needs: ΔW = scale·left·right, and DoRA's magnitudes if any."""

    left: np.ndarray
    right: np.ndarray
    scale: float
    magnitude: Optional[np.ndarray]
    embedding: bool = False


def _adapter_row(module: LoraModule, lora: LoraConfig, where: str, metric_options: Any, *, bfe_asked: bool = True,
                 unread: Optional[dict[str, str]] = None) -> tuple[dict[str, Any], _Factors]:
    """``bfe_asked``: ``bfe`` and ``lambda`` are the bfe group's columns, computed (with --lambda) only when --metrics
    names it; ``unread``: the reader's reason per factor it cannot give (``fc.lora_A``)."""
    name = f"{module.name}.weight"
    if module.a is None or module.b is None:
        missing = "lora_A" if module.a is None else "lora_B"
        why = (unread or {}).get(f"{module.name}.{missing}")
        raise CorruptCheckpointError(f"{where}: module {module.name!r} has no {missing} factor" if why is None else
                                     f"{where}: module {module.name!r}: its {missing} factor cannot be read ({why})")
    r, alpha = lora.rank_and_alpha(module.name)
    scale = lora.scaling(module.name)
    left, right = lora_factors(module.a.load(), module.b.load(), embedding=module.embedding)
    if left.shape[1] != right.shape[0]:
        raise CorruptCheckpointError(f"{where}: {module.name!r}: lora_A and lora_B disagree on the rank "
                                     f"({right.shape[0]} vs {left.shape[1]})")
    if left.shape[1] != r:
        raise CorruptCheckpointError(f"{where}: {module.name!r}: the adapter config gives r = {r} (rank_pattern) "
                                     f"but the factors have rank {left.shape[1]}")
    kind = "embedding" if module.embedding else "conv" if len(module.a.shape) == 4 else "linear"
    shape: list[int] = ([left.shape[0], module.a.shape[1], *module.a.shape[2:]] if kind == "conv"
                        else [left.shape[0], right.shape[1]])
    if kind == "linear" and lora.fan_in_fan_out:
        shape = shape[::-1]
    row: dict[str, Any] = {
        "name": name, "role": role_of(name, len(shape)), "kind": "lora", "lora_type": kind, "shape": shape,
        "dtype": module.a.dtype, "quant": None, "rows": left.shape[0], "cols": right.shape[1], "r": r,
        "lora_alpha": alpha, "scaling": scale, "n_eigs": r, "form": "rank-r",
    }
    finite = np.isfinite(left).all() and np.isfinite(right).all()  # else numpy's SVD raises LinAlgError
    with np.errstate(over="ignore", invalid="ignore"):  # B·A past float64's range: said in the row's reasons
        singular = core_singular_values(left, right, scale) if finite else np.full(r, math.nan)
    # --metrics picks the groups here too: a --lambda without bfe is refused as read by nothing
    values, reasons = adapter_columns(singular, metric_options.lam, bfe_asked=bfe_asked)
    row.update(values)
    m = None
    if module.magnitude is not None:
        m = to_numpy(module.magnitude.load()).astype(np.float64).reshape(-1)
        row.update({"dora_magnitude_norm": float(np.linalg.norm(m)), "dora_magnitude_mean": float(m.mean()),
                    "dora_magnitude_min": float(m.min()), "dora_magnitude_max": float(m.max())})
    row["reasons"] = reasons
    return row, _Factors(left, right, scale, m, module.embedding)


def _merge_with_base(
    base: Any, layers: list[dict[str, Any]], factors: dict[str, _Factors], lora: LoraConfig, context: Any, top_k: int,
    *, stream: bool | None = None,
) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """Add the merged-module columns to ``layers``, streaming the base one tensor at a time as a score
    reads it; returns the base's provenance, its weights' order and the order's aliases."""
    by_weight = {f"{name}.weight": name for name in factors}
    rows = {row["name"]: row for row in layers if row.get("kind") == "lora"}
    found: set[str] = set()
    stored: list[str] = []
    # --stream streams a remote base beside a local adapter (score_here opened the adapter)
    with open_source(base, stream=stream if remote_ref(base) else None) as source:
        for entry, consumed in engine.entries(source):
            stored.append(entry.name)
            module = by_weight.get(entry.name)
            if module is None or consumed is not None:
                continue
            row = rows[entry.name]
            found.add(entry.name)
            if tuple(entry.shape) != tuple(row["shape"]):
                raise CorruptCheckpointError(f"{source.provenance.source}: {entry.name} has shape "
                                             f"{list(entry.shape)} but the adapter's ΔW is {row['shape']}: not this "
                                             "adapter's base model")
            plan = engine.plan_entry(entry, min_eigs=engine.planning_min_eigs(context.options))
            if isinstance(plan, Skip):
                row["reasons"]["merged"] = f"base weight: {plan.reason}"
                continue
            f = factors[module]
            if lora.use_dora and f.magnitude is None:  # ΔW's own spectrum needs none; the merged weight does
                row["reasons"]["merged"] = ("the adapter config says use_dora, but the module has no "
                                            "lora_magnitude_vector: W0 + ΔW is not the adapted weight")
                continue
            w0 = entry.load()
            merged = to_numpy(w0).astype(np.float64) + delta_weight(
                f.left, f.right, f.scale, tuple(entry.shape), lora.fan_in_fan_out)
            if f.magnitude is not None:
                # PEFT's DoRA embedding takes the norm per embedding dimension (over the vocabulary).
                merged = _dora_rescale(merged, f.magnitude, lora.fan_in_fan_out or f.embedding)
            with pin_threads():
                change = pair_change((w0, merged), (plan, plan), (entry.name,) * 2, context, top_k, ("base", "merged"))
            del w0, merged
            if isinstance(change, str):
                row["reasons"]["merged"] = change
                continue
            _add_change(row, change)
        description = source.description
        order = list(description.order) if description is not None else stored
        aliases = dict(description.aliases) if description is not None else {}
        provenance = source.provenance.to_dict()
    for name, row in rows.items():
        if name not in found:
            row["reasons"]["merged"] = f"no tensor {name!r} in the base checkpoint"
    return provenance, order, aliases


def _dora_rescale(merged: np.ndarray, magnitude: np.ndarray, fan_in_fan_out: bool) -> np.ndarray:
    """DoRA's merge, as PEFT's: each output row of W₀ + ΔW (column when ``fan_in_fan_out``) rescaled to its magnitude."""
    w = merged.T if fan_in_fan_out else merged
    flat = w.reshape(w.shape[0], -1)
    out = (flat * (magnitude.reshape(-1) / np.linalg.norm(flat, axis=1))[:, None]).reshape(w.shape)
    return out.T if fan_in_fan_out else out


def _add_change(row: dict[str, Any], change: dict[str, Any]) -> None:
    """``wbfe compare``'s columns for W₀ → merged, with its ``_a``/``_b`` sides named ``_base``/``_merged``."""
    for key, value in change.items():
        if key == "reasons":
            for column, why in value.items():
                row["reasons"][_side_name(column)] = why.replace("A: ", "base: ").replace("B: ", "merged: ")
        elif key not in ("n_eigs", "gamma", "form"):
            row[_side_name(key)] = value


def _side_name(key: str) -> str:
    return key[:-2] + _SIDES[key[-2:]] if key[-2:] in _SIDES else key


def _summarise(layers: list[dict[str, Any]], groups: tuple[Any, ...], merged: bool) -> dict[str, Any]:
    adapted = [row for row in layers if row.get("kind") == "lora"]
    saved = [row for row in layers if row.get("kind") == "modules_to_save"]
    ranks = [int(row["r"]) for row in adapted]
    summary: dict[str, Any] = {"n_layers": len(layers), "n_adapted": len(adapted), "n_modules_to_save": len(saved),
                               "r_min": min(ranks, default=None), "r_max": max(ranks, default=None)}
    columns: tuple[str, ...] = ("stable_rank", "effective_rank", "frobenius_norm", "spectral_norm")
    if any(group.name == "bfe" for group in groups):  # ΔW's bfe is the bfe group's (see _adapter_row)
        columns = ("bfe", *columns)
    for column in columns:
        summary[f"{column}_mean"], summary[f"{column}_n"] = column_mean(adapted, column)
    largest = max(adapted, key=lambda row: row["frobenius_norm"], default=None)
    if largest is not None and not largest["frobenius_norm"] > 0:  # lora_B = 0 everywhere: as initialised
        largest = None
        summary["untrained"] = "every ΔW is 0 (lora_B = 0, as PEFT initialises it): the adapter was not trained"
    summary["largest_update"] = None if largest is None else largest["name"]
    summary["largest_update_frobenius_norm"] = math.nan if largest is None else largest["frobenius_norm"]
    if merged:
        summary["rel_frobenius_mean"], summary["rel_frobenius_n"] = column_mean(adapted, "rel_frobenius")
        for group in groups:
            for column in group.summary_columns:
                summary[f"d_{column}_mean"], summary[f"d_{column}_n"] = column_mean(adapted, f"d_{column}")
                summary[f"{column}_merged_mean"], _ = column_mean(adapted, f"{column}_merged")
    summary["head"] = head = find_head([row["name"] for row in layers])
    if head is not None:
        next(row for row in layers if row["name"] == head)["role"] = "head"
    return summary
