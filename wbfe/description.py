"""``wbfe describe``: which matrices a score would analyse, and how, from the headers alone
(WeightWatcher's ``describe()``); ``wbfe.esd``: one matrix's eigenvalues (its ``get_ESD()``).
Not named ``describe``, which would shadow the function ``wbfe.describe``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

from wbfe import engine
from wbfe.errors import InvalidOptionError, NoUsableMatrixError
from wbfe.engine.heads import HeadChoice, UNSELECTED, choose_head
from wbfe.engine.matrices import MatrixPlan, component_of
from wbfe.engine.ties import shared_storage
from wbfe.framework import order_rows
from wbfe.framework.transformers_source import plain_layouts
from wbfe.linalg.spectra import DegenerateMatrixError
from wbfe.options import ConvView, ScoreOptions, field_defaults, refuse_keywords
from wbfe.render.text import ToJson
from wbfe.sources import open_source

__all__ = ["Description", "describe", "esd"]

_DEFAULTS = field_defaults(ScoreOptions)  # the keywords' defaults are the options' own


@dataclass
class Description(ToJson):
    """What a score of one checkpoint would analyse.

    Attributes:
        model: ``source``, ``format``, ``files`` (no ``sha256``: nothing is read), and ``framework``
            (what decided, ``used``) where the checkpoint has a description or a config.
        matrices: one dict per matrix: ``name``, ``shape``, ``N`` and ``M`` (larger and smaller side),
            ``n_slices``, ``n_eigs``, ``role``, ``component``, ``convention``, ``form``, ``dtype``,
            ``quant``, ``head`` (bool).
        skipped: ``name``, ``shape``, ``dtype`` and ``reason`` of every tensor a score would skip.
    """

    model: dict[str, Any]
    matrices: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    head: Optional[str] = None
    head_source: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __repr__(self) -> str:
        return (f"Description(source={self.model.get('source')!r}, matrices={len(self.matrices)}, "
                f"skipped={len(self.skipped)}, head={self.head!r})")


def _refuse_min_eigs(min_eigs: int, ww_compatible: bool) -> None:
    if min_eigs != _DEFAULTS["min_eigs"] and not ww_compatible:  # a description fits no tail
        raise InvalidOptionError(f"--min-eigs {min_eigs} decides a description only with --ww-compatible "
                                 "(which skips smaller matrices): give --ww-compatible or drop --min-eigs")


def describe_options(**given: Any) -> ScoreOptions:
    """The options a description plans with, a ``bfe`` score's; InvalidOptionError for a bad option, or ``min_eigs``
    without ``ww_compatible`` (where it decides which matrices are analysed: a description fits no tail)."""
    _refuse_min_eigs(given.get("min_eigs", _DEFAULTS["min_eigs"]), bool(given.get("ww_compatible")))
    return ScoreOptions(metrics=("bfe",), **given)


def describe(
    ref: Any,
    *,
    conv: Optional[ConvView] = _DEFAULTS["conv"],
    layers: Optional[str] = _DEFAULTS["layers"],
    head: Optional[str] = _DEFAULTS["head"],
    min_eigs: int = _DEFAULTS["min_eigs"],
    ww_compatible: bool = _DEFAULTS["ww_compatible"],
    stream: Optional[bool] = _DEFAULTS["stream"],
    options: Optional[ScoreOptions] = None,
) -> Description:
    """The matrices :func:`wbfe.score` would analyse in ``ref`` (any reference it accepts), planned
    exactly as it plans them, from the headers alone. Where wbfe's config rules give the head and
    orientation a built transformers model would, they decide without building it, and the rows are
    in the checkpoint's order (``model["framework"]`` says which decided; docs/scoring.md).

    Args:
        conv, layers, head, min_eigs, ww_compatible, stream: as for :func:`wbfe.score`; or
            ``options``. Streamed, only the headers (and ``config.json``) are fetched.

    Raises:
        InvalidOptionError: a bad option, or settings given both as ``options`` and as keywords; the errors of
            :func:`wbfe.sources.open_source`.

    Example:
        >>> import torch, wbfe
        >>> d = wbfe.describe({"fc.weight": torch.zeros(10, 64), "fc.bias": torch.zeros(10)})
        >>> [(m["name"], m["N"], m["M"], m["form"], m["head"]) for m in d.matrices]
        [('fc.weight', 64, 10, 'primal', True)]
    """
    given = dict(conv=conv, layers=layers, head=head, min_eigs=min_eigs, ww_compatible=ww_compatible, stream=stream)
    if options is None:
        options = describe_options(**given)
    else:
        refuse_keywords(ScoreOptions, given)
        _refuse_min_eigs(options.min_eigs, options.ww_compatible)
    with open_source(ref, stream=options.stream) as source:
        why = None if source.own_description is not None else plain_layouts(source.config)
        if why is not None:  # the rules may decide without building the model (seconds of imports)
            source.leave_to_rules(f"describe: {why}, and the config decides the head; rows in the "
                                  "checkpoint's order (a score gives the model's)")
            planned = _planned(source, options)
            if _decided(planned[3], planned[1]):
                return _description(*planned)
            source.leave_to_rules(None)  # the rules leave the head open: ask the framework
        return _description(*_planned(source, options))


def _planned(source: Any, options: ScoreOptions) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]],
                                                          Optional[HeadChoice]]:
    """The model, matrices, skipped tensors and head a score of ``source`` would report."""
    matrices: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    storage: dict[Any, str] = {}
    for entry, plan in engine.stream(source, options):
        if isinstance(plan, MatrixPlan):  # a name sharing an earlier matrix's storage is skipped as tied, as scored
            plan = shared_storage(entry, storage) or plan
        if isinstance(plan, MatrixPlan):
            matrices.append({"name": plan.name, "shape": list(plan.shape), "N": max(plan.rows, plan.cols),
                             "M": min(plan.rows, plan.cols), "n_slices": plan.n_slices, "n_eigs": plan.n_eigs,
                             "role": plan.role, "component": component_of(plan.name), "convention": plan.convention,
                             "form": "primal" if plan.rows <= plan.cols else "dual", "dtype": plan.dtype,
                             "quant": entry.quant})
        else:
            skipped.append(plan.to_dict())
    unselected = [s["name"] for s in skipped if s["reason"] == UNSELECTED]
    if unselected and not matrices:  # a score refuses it: a pattern that selects nothing is a slip
        raise NoUsableMatrixError(f"{source.provenance.source}: --layers {options.layers!r} selects no weight matrix "
                                  f"of its {len(unselected)} tensors: leave --layers out to list them all",
                                  ref=source.provenance.source)
    description = source.description
    model = {"source": source.provenance.source, "format": source.provenance.format,
             "files": list(source.provenance.files)}
    if "framework" in source.provenance.extra:
        model["framework"] = source.provenance.extra["framework"]
    if description is not None:  # the model's own order, as a score gives it
        matrices = order_rows(matrices, description.order, description.aliases)
        skipped = order_rows(skipped, description.order, description.aliases)
    return model, matrices, skipped, (choose_head(matrices, skipped, override=options.head, hint=source.head_hint,
                                                  config=source.config, description=description) if matrices else None)


def _decided(choice: Optional[HeadChoice], matrices: list[dict[str, Any]]) -> bool:
    """Whether the rules named the head the framework would: ``--head``; one matrix of the head's size
    (``config``, no note); the input embedding (``tied``) where no other matrix has its outputs."""
    if choice is None or choice.name is None or choice.source not in ("option", "config", "tied"):
        return False
    if choice.source == "config":
        return choice.note is None  # a note: several matrices of the head's size, the framework knows which
    if choice.source == "tied":
        outputs = next(m for m in matrices if m["name"] == choice.name)["shape"][0]
        return not any(m["name"] != choice.name and m["role"] != "embedding" and m["shape"][0] == outputs
                       for m in matrices)
    return True


def _description(model: dict[str, Any], matrices: list[dict[str, Any]], skipped: list[dict[str, Any]],
                 choice: Optional[HeadChoice]) -> Description:
    for row in matrices:
        row["head"] = choice is not None and row["name"] == choice.name
        if row["head"]:
            row["role"] = "head"
    return Description(model=model, matrices=matrices, skipped=skipped,
                       head=None if choice is None else choice.name, head_source=None if choice is None else choice.source)


def esd(ref: Any, name: str, *, conv: ConvView = "flatten", device: str = "auto") -> Any:
    """The eigenvalues of the smaller Gram matrix of the matrix ``name`` (as stored, or its module name)
    of ``ref``, ascending, as a score computes them (float64; pooled over slices with ``conv="slices"``).

    Raises:
        InvalidOptionError: no such tensor (close names are suggested), or it is not a matrix.
        DegenerateMatrixError: the matrix is non-finite or all zero, or its eigenvalues leave float64's range
            (:func:`wbfe.engine.layer_spectrum` gives them scaled, with their ``log_scale``).

    Example:
        >>> import torch, wbfe
        >>> wbfe.esd({"fc.weight": 2 * torch.eye(3)}, "fc").tolist()
        [4.0, 4.0, 4.0]
    """
    plan, spectrum = engine.layer_spectrum(ref, name, conv=conv, device=device)
    eigs = np.asarray(spectrum.eigs, dtype=float)
    if not spectrum.log_scale:
        return eigs
    with np.errstate(over="ignore", under="ignore"):
        true = eigs * np.exp(spectrum.log_scale)
    if not np.isfinite(true).all() or np.count_nonzero(true) < np.count_nonzero(eigs):
        raise DegenerateMatrixError(f"{plan.name}: its eigenvalues leave float64's range (e^{spectrum.log_scale:.0f} "
                                    "times its scaled ones); wbfe.engine.layer_spectrum gives them scaled, with "
                                    "log_scale")
    return true


