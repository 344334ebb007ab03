"""A run's trajectory: each checkpoint scored once at λ*, then h_t = κ_t/β_t against h*(λ) and where to stop.

The HTMP fit, α and F* do not depend on λ, so every λ-dependent column is derived afterwards (docs/math.md §2-3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from wbfe.errors import InvalidOptionError
from wbfe.options import WATCH_LAYERS, WatchOptions, field_defaults, positive_lambda
from wbfe.render.text import ToJson, as_float, json_ready, text_table
from wbfe.watch.guidance import (BFE_OPT_CAVEAT, FixedLambdaTrend, bfe_at, describe_trend, fittable_hint,
                                  fixed_lambda_trend, nan_notes)
from wbfe.watch.rule import Recommendation, critical_lambda, recommend
from wbfe.watch.runs import CheckpointRef, Run, discover_run

__all__ = ["LayerPoint", "CheckpointPoint", "Trajectory", "WatchResult", "trajectory", "watch", "result_at", "bfe_at",
           "CheckpointScan", "scan_checkpoint"]

METRICS = "bfe,htsr,htmp"
_DEFAULTS = field_defaults(WatchOptions)  # the keywords' defaults are the options' own
# Scored anyway by METRICS (``rand_distance`` only with the opt-in ``rand`` group): kept for the stopping rules.
EXTRA_COLUMNS = ("rows", "cols", "log_norm", "log_spectral_norm", "stable_rank", "alpha_weighted", "rand_distance")


@dataclass(frozen=True)
class LayerPoint:
    """The λ-independent numbers of one matrix at one checkpoint (NaN where a fit failed): the HTMP fit (κ, β, τ,
    KS), BFE-W at λ* = 1/mean(e), α, why a column is NaN, and the :data:`EXTRA_COLUMNS` the stopping rules read."""

    name: str
    role: str
    gamma: float
    kappa: float
    beta: float
    tau: float
    ks: float
    bfe_opt: float
    lambda_star: float
    alpha: float
    reasons: dict[str, str] = field(default_factory=dict, compare=False)
    n_eigs: int = 0
    extra: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def h(self) -> float:
        """Scaled heavy-tailedness h = κ/β."""
        return self.kappa / self.beta

    def h_star(self, lam: float) -> float:
        """h*(λ) of this fit (NaN when the fit failed)."""
        if not all(math.isfinite(v) for v in (self.kappa, self.beta, self.tau)):
            return math.nan
        from wbfe.metrics import htmp

        return float(htmp.h_star(lam, self.gamma, kappa=self.kappa, c=self.beta * self.tau))

    def columns(self, lam: Optional[float]) -> dict[str, Any]:
        """The output columns; the λ-dependent ones are NaN when ``lam`` is None."""
        row: dict[str, Any] = {
            "name": self.name, "role": self.role, "gamma": self.gamma, "htmp_kappa": self.kappa, "htmp_beta": self.beta,
            "htmp_tau": self.tau, "htmp_ks": self.ks, "h": self.h, "h_star": math.nan, "f_inf": math.nan,
            "bfe": self.bfe_opt if lam is None else bfe_at(self.bfe_opt, self.lambda_star, lam),
            "bfe_opt": self.bfe_opt, "alpha": self.alpha, "diagnosis": None,
        }
        if lam is not None and math.isfinite(row["h"]):
            from wbfe.metrics import htmp

            row["h_star"] = self.h_star(lam)
            row["f_inf"] = float(htmp.f_inf(lam, self.kappa, self.gamma, self.beta, self.tau))
            row["diagnosis"] = htmp.diagnose(row["h"], row["h_star"])
        if self.reasons:
            row["reasons"] = dict(self.reasons)
        return row


@dataclass(frozen=True)
class CheckpointPoint:
    """One scored checkpoint: its step, source, test metrics if known, its layers, and (``fittable``) every matrix,
    selected or not, with at least ``min_eigs`` eigenvalues (0: unknown)."""

    step: int
    source: str
    layers: tuple[LayerPoint, ...]
    test_loss: float = math.nan
    test_accuracy: float = math.nan
    fittable: tuple[tuple[str, int], ...] = ()
    min_eigs: int = 0


@dataclass
class Trajectory:
    """The scored checkpoints of one run, in step order."""

    run: str
    points: list[CheckpointPoint] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return [p.step for p in self.points]

    @property
    def layer_names(self) -> list[str]:
        """Every layer seen, in first-seen order."""
        return list(dict.fromkeys(layer.name for point in self.points for layer in point.layers))

    def matrix(self, value: Callable[[LayerPoint], float]) -> np.ndarray:
        """A (checkpoints, layers) array of ``value(layer)``, NaN where a layer is missing."""
        names = self.layer_names
        out = np.full((len(self.points), len(names)), np.nan)
        for t, point in enumerate(self.points):
            for layer in point.layers:
                out[t, names.index(layer.name)] = value(layer)
        return out

    def critical_lambdas(self) -> np.ndarray:
        """Per checkpoint, the largest λ at which it is on the over-fit side (:mod:`wbfe.watch.rule`)."""
        return critical_lambda(self.matrix(lambda x: x.h), self.matrix(lambda x: x.h_star(1.0)))

    def test_losses(self) -> np.ndarray:
        return np.array([p.test_loss for p in self.points], dtype=float)


def _layer_point(row: dict[str, Any]) -> LayerPoint:
    return LayerPoint(
        name=row["name"], role=row.get("role", ""), gamma=as_float(row.get("gamma")),
        kappa=as_float(row.get("htmp_kappa")), beta=as_float(row.get("htmp_beta")), tau=as_float(row.get("htmp_tau")),
        ks=as_float(row.get("htmp_ks")), bfe_opt=as_float(row.get("bfe")), lambda_star=as_float(row.get("lambda")),
        alpha=as_float(row.get("alpha")), reasons=dict(row.get("reasons") or {}), n_eigs=int(row.get("n_eigs") or 0),
        extra={k: as_float(row.get(k)) for k in EXTRA_COLUMNS if k in row},
    )


@dataclass(frozen=True)
class CheckpointScan:
    """One checkpoint scored at λ*: the selected layers, and (name, eigenvalue count) of every matrix with at least
    ``min_eigs`` eigenvalues (those an HTMP fit can use)."""

    layers: tuple[LayerPoint, ...]
    fittable: tuple[tuple[str, int], ...]
    min_eigs: int


def scan_checkpoint(ref: Any, *, layers: str = _DEFAULTS["layers"], head: Optional[str] = _DEFAULTS["head"],
                    device: str = _DEFAULTS["device"], metrics: str = METRICS) -> CheckpointScan:
    """Score one checkpoint (anything :func:`wbfe.score` accepts) at λ*, keep the selected ``layers`` (``head``,
    ``all``, ``fittable``: those with an HTMP fit, or a regex on tensor names) and list the fittable matrices.
    ``metrics``: at least ``bfe,htsr,htmp`` (``rand`` adds ``rand_distance``).

    Raises:
        InvalidOptionError: ``layers="head"`` and no head was found. The errors of :func:`wbfe.score`.
    """
    from wbfe.scoring import score

    WatchOptions(layers=layers, head=head, device=device)
    result = score(ref, metrics=metrics, lam="opt", layers=None if layers in WATCH_LAYERS else layers, head=head,
                   device=device)
    min_eigs = int((result.model.get("options") or {}).get("min_eigs") or 0)
    fit_rows = [r for r in result.layers if int(r.get("n_eigs") or 0) >= min_eigs]
    rows = fit_rows if layers == "fittable" else result.layers
    if layers == "head":
        name = result.summary.get("head")
        if name is None:
            raise InvalidOptionError(f"{result.model.get('source')}: no classifier head found by name; "
                                     "pass --head NAME or --layers all|fittable|REGEX")
        rows = [r for r in rows if r["name"] == name]
    fittable = tuple((r["name"], int(r.get("n_eigs") or 0)) for r in fit_rows)
    return CheckpointScan(tuple(_layer_point(r) for r in rows), fittable, min_eigs)


def trajectory(run: Union[str, Path, Run], *, layers: str = _DEFAULTS["layers"],
               head: Optional[str] = _DEFAULTS["head"], device: str = _DEFAULTS["device"],
               progress: Optional[Callable[[int, Optional[int], str], None]] = None,
               metrics: str = METRICS) -> Trajectory:
    """Score every checkpoint of a run (:func:`~wbfe.watch.runs.discover_run`'s, or a :class:`Run`) with
    :func:`scan_checkpoint`'s options; ``progress`` is called as :func:`wbfe.score` calls it per matrix: with
    (0, total, "") before the first checkpoint, then with (done, total, "step N") after each."""
    WatchOptions(layers=layers, head=head, device=device)  # every option before the first checkpoint
    run = run if isinstance(run, Run) else discover_run(run)
    out = Trajectory(run=run.name)
    total = len(run.checkpoints)
    if progress is not None:
        progress(0, total, "")
    for done, ck in enumerate(run.checkpoints, start=1):
        out.points.append(checkpoint_point(ck, scan_checkpoint(ck.ref, layers=layers, head=head, device=device,
                                                                  metrics=metrics)))
        first, last = ([x.name for x in p.layers] for p in (out.points[0], out.points[-1]))
        if sorted(first) != sorted(last):  # h_t would compare other matrices from one step to the next
            raise InvalidOptionError(f"{run.name}: step {ck.step} selects layers {_few(last)} but step "
                                     f"{out.points[0].step} selected {_few(first)}: a run's checkpoints are one "
                                     "model's (one architecture)")
        if progress is not None:
            progress(done, total, f"step {ck.step}")
    return out


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "") if names else "none"


def checkpoint_point(ck: CheckpointRef, scanned: CheckpointScan) -> CheckpointPoint:
    """Pair a checkpoint reference with its scan."""
    source = ck.ref if isinstance(ck.ref, str) else f"<{type(ck.ref).__name__}>"
    return CheckpointPoint(ck.step, source, scanned.layers, ck.test_loss, ck.test_accuracy, scanned.fittable,
                           scanned.min_eigs)


@dataclass
class WatchResult(ToJson):
    """Trajectories of one run at one λ, and the recommended checkpoint.

    Attributes:
        lam: the prior precision of h*, F∞ and BFE-W; None when none was given (no recommendation).
        lam_source: ``given``, ``calibrated`` or None.
        recommendation: the rule's choice (None when ``lam`` is None and no stopping rule decided).
        stopping: the data-free stopping rule that decided and its measured figures
            (:func:`wbfe.watch.decide.result_by_rule`); None for the h* rule at a given λ.
    """

    trajectory: Trajectory
    lam: Optional[float]
    lam_source: Optional[str]
    recommendation: Optional[Recommendation]
    layers: str = "head"
    stopping: Optional[dict[str, Any]] = None

    def comparison(self) -> Optional[dict[str, Any]]:
        """Test metrics at the recommended and the best checkpoint (the lowest test loss, else the best accuracy:
        ``metric`` says which); None without test metrics."""
        loss = self.trajectory.test_losses()
        acc = np.array([p.test_accuracy for p in self.trajectory.points], dtype=float)
        rec = self.recommendation
        by_loss = bool(np.any(np.isfinite(loss)))
        if (not by_loss and not np.any(np.isfinite(acc))) or rec is None or rec.index is None:
            return None
        best, r, steps = int(np.nanargmin(loss) if by_loss else np.nanargmax(acc)), rec.index, self.trajectory.steps
        return {"metric": "test_loss" if by_loss else "test_accuracy", "best_step": steps[best],
                "best_test_loss": float(loss[best]), "best_test_accuracy": float(acc[best]),
                "recommended_step": rec.step, "recommended_test_loss": float(loss[r]),
                "recommended_test_accuracy": float(acc[r]), "test_loss_gap": float(loss[r] - loss[best]),
                "test_accuracy_gap": float(acc[best] - acc[r]), "steps_from_best": steps[r] - steps[best]}

    def fixed_lambda(self) -> FixedLambdaTrend:
        """BFE-W at one λ across the run: the given λ, else each layer's λ* at the last checkpoint."""
        t = self.trajectory
        return fixed_lambda_trend(t.steps, t.layer_names, t.matrix(lambda x: x.bfe_opt),
                                  t.matrix(lambda x: x.lambda_star), self.lam)

    def signal(self) -> list[dict[str, Any]]:
        """Per checkpoint, h_t against h*: the median over layers of h/h*(1), λ_c = its inverse, and with a λ
        ``h_over_h_star`` = λ/λ_c (docs/watch.md)."""
        return [{"step": step, "h_over_h_star_1": float(1.0 / c), "lambda_c": float(c),
                 **({"h_over_h_star": float(self.lam / c)} if self.lam is not None else {})}
                for step, c in zip(self.trajectory.steps, self.trajectory.critical_lambdas())]

    def notes(self) -> tuple[list[str], Optional[str]]:
        """The numbered reasons for NaN rows and the hint naming fittable layers (:mod:`wbfe.watch.guidance`)."""
        return nan_notes(self.trajectory.points)[1], fittable_hint(self.trajectory.points, self.layers)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape: ``{"run", "lambda", "checkpoints": [...], "recommended": {...}, ...}``."""
        rec = self.recommendation
        fixed = self.fixed_lambda()
        names = self.trajectory.layer_names
        checkpoints = [{"step": p.step, "source": p.source, "test_loss": p.test_loss, "test_accuracy": p.test_accuracy,
                        "layers": [{**x.columns(self.lam), "bfe_fixed": float(fixed.bfe[t, names.index(x.name)])}
                                   for x in p.layers]} for t, p in enumerate(self.trajectory.points)]
        if rec is None:
            recommended: dict[str, Any] = {"step": None, "reason": NO_LAMBDA}
        elif self.stopping is not None:
            recommended = {"step": rec.step, "rule": self.stopping["name"], "reason": rec.reason}
        else:
            recommended = {"step": rec.step, "crossed": rec.crossed, "reason": rec.reason}
        notes, hint = self.notes()
        return json_ready({
            "run": self.trajectory.run, "lambda": self.lam, "lambda_source": self.lam_source,
            "layer_selection": self.layers,
            "rule": (self.stopping["description"] if self.stopping is not None else
                     "first checkpoint (step order) where the median over the selected layers of log(h/h*) <= 0"),
            "stopping_rule": self.stopping, "checkpoints": checkpoints, "recommended": recommended,
            "comparison": self.comparison(), "signal": self.signal(), "bfe_fixed_lambda": fixed.to_dict(),
            "notes": notes, "hint": hint,
        })

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per (checkpoint, layer) for tables and CSV (``note``: the NaN reason's number)."""
        rec_step = self.recommendation.step if self.recommendation else None
        fixed = self.fixed_lambda()
        names = self.trajectory.layer_names
        marks = nan_notes(self.trajectory.points)[0]
        return [{"step": p.step, **{k: v for k, v in layer.columns(self.lam).items() if k != "reasons"},
                 "bfe_fix": float(fixed.bfe[t, names.index(layer.name)]), "test_loss": p.test_loss,
                 "test_accuracy": p.test_accuracy, "keep": "<==" if p.step == rec_step else "",
                 "note": f"[{marks[t, layer.name]}]" if (t, layer.name) in marks else ""}
                for t, p in enumerate(self.trajectory.points) for layer in p.layers]

    def table(self) -> str:
        """The text table: trajectories, NaN notes, the run-level signal, the recommendation and the comparison."""
        # h*, F∞ need a λ; without one, BFE-W at λ* and at the last checkpoint's λ* side by side
        columns = ["step", "name", "htmp_kappa", "htmp_beta", "htmp_tau", "h",
                   *(["bfe", "bfe_fix"] if self.lam is None else ["h_star", "f_inf", "bfe"]), "alpha"]
        columns += [c for c in ("test_loss", "test_accuracy")
                    if any(math.isfinite(getattr(p, c)) for p in self.trajectory.points)]
        rows = self.rows()
        columns += ["keep"] + (["note"] if any(r["note"] for r in rows) else [])
        lam = "none" if self.lam is None else f"{self.lam:.6g} ({self.lam_source})"
        lines = [f"run: {self.trajectory.run}   lambda: {lam}   layers: {self.layers}", "", text_table(rows, columns)]
        notes, hint = self.notes()
        lines += [f"  {n}" for n in notes] + ([f"hint: {hint}"] if hint else []) + ["", *self._run_lines()]
        rec = self.to_dict()["recommended"]
        lines.append(f"recommended step: {rec['step'] if rec['step'] is not None else '-'} — {rec['reason']}")
        if self.stopping is not None:
            lines += [f"rule: {line}" for line in self.stopping["lines"]]
        comp = self.comparison()
        if comp is not None:
            what = "loss" if comp["metric"] == "test_loss" else "accuracy"
            value, gap = comp[f"recommended_test_{what}"], comp[f"test_{what}_gap"]
            rec = (f"{value:.4f} (gap {gap:+.4f}{'; no test loss given' if what == 'accuracy' else ''})"
                   if math.isfinite(value) else f"no test {what} at step {comp['recommended_step']}")
            lines.append(f"best test {what} at step {comp['best_step']} ({comp[f'best_test_{what}']:.4f}); "
                         f"recommended: {rec}")
        return "\n".join(lines) + "\n"

    def _run_lines(self) -> list[str]:
        fixed = self.fixed_lambda()
        ratio = "h_over_h_star" if self.lam is not None else "h_over_h_star_1"
        rows = [{**s, "bfe_fixed": b, "bfe_opt": o} for s, b, o in zip(self.signal(), fixed.run_bfe, fixed.run_bfe_opt)]
        where = (f"the given λ = {self.lam:.6g}" if fixed.source == "given" else
                 f"each layer's λ* at the last checkpoint (step {fixed.source_step})")
        side = "h/h*(λ) ≤ 1 is the over-fit side" if self.lam is not None else \
            "a checkpoint is on the over-fit side for every λ ≤ lambda_c"
        if not any(math.isfinite(r["lambda_c"]) for r in rows):
            side = "no selected layer has a finite h/h*: see the notes above"
        return [f"across the run (median over layers; {side}):",
                text_table(rows, ["step", ratio, "lambda_c", "bfe_fixed", "bfe_opt"]),
                f"BFE-W at {where}: {describe_trend(fixed.steps, fixed.run_bfe)}", f"note: {BFE_OPT_CAVEAT}", ""]


NO_LAMBDA = ("no lambda given: pass --lambda FLOAT or --lambda calibrated (with --calibrate RUNS.csv); "
             "meanwhile read lambda_c (h_t against h*) and BFE-W at a fixed λ above")


def result_at(traj: Trajectory, lam: Optional[float], *, lam_source: Optional[str] = None,
              layers: str = "head") -> WatchResult:
    """Apply the rule to a scored trajectory at ``lam`` (no recommendation when ``lam`` is None)."""
    if lam is None:
        return WatchResult(traj, None, None, None, layers)
    lam = positive_lambda(lam)
    rec = recommend(traj.steps, traj.critical_lambdas(), lam)
    return WatchResult(traj, lam, lam_source or "given", rec, layers)


def watch(run: Union[str, Path, Run], *, lam: Optional[float] = _DEFAULTS["lam"], layers: str = _DEFAULTS["layers"],
          head: Optional[str] = _DEFAULTS["head"], device: str = _DEFAULTS["device"],
          progress: Optional[Callable[[int, Optional[int], str], None]] = None) -> WatchResult:
    """Score a run's checkpoints (as :func:`trajectory`, ``progress`` too) and recommend the one to keep by the h*
    rule at prior precision ``lam`` (None: trajectories without a recommendation).

    Raises:
        InvalidOptionError: a bad λ or layer selection; the errors of :func:`trajectory`.
    """
    WatchOptions(layers=layers, lam=lam, head=head, device=device)  # every option before the first checkpoint
    if lam is not None:
        lam = positive_lambda(lam)
    return result_at(trajectory(run, layers=layers, head=head, device=device, progress=progress), lam, layers=layers)
