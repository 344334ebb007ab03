"""Data-free stopping rules: which checkpoint of a run to keep, from its weights alone, and how each is measured.

A run is reduced to :class:`RunSignals`: per checkpoint, run-level series over the selected matrices
that an HTMP fit can use (mean over the matrices finite at every checkpoint, so the series are
comparable along the run). A :class:`Rule` maps those signals (and, for rules with a free parameter,
a parameter chosen on *other* runs) to one checkpoint. :func:`evaluate_rules` measures every rule
leave-one-run-out on runs with test losses: regret = test loss at the chosen checkpoint minus the
run's lowest test loss, against keeping the last checkpoint and against a validation-set oracle.

The rules (``RULES``) and what they read:

- ``last``: keep the last checkpoint (the baseline every rule must beat);
- ``h_star_first`` / ``h_star_fanin`` / ``h_star_loo``: the BFE-W paper's rule, the first checkpoint
  (after the initialisation) with median log(h/h*(λ)) ≤ 0, with λ fixed in advance per matrix from the
  run's first checkpoint (λ* there), from the fan-in (prior variance 1/fan-in), or one λ chosen on
  the other runs. Since h/h*(λ) ≈ λ·mean(e) (docs/math.md), these fire only when the weights' scale falls;
- ``bfe_last_min`` / ``bfe_first_min``: the minimum over the run of BFE-W at a fixed λ per matrix (its
  λ* at the last / first checkpoint);
- ``alpha_cross2``: the first checkpoint whose mean power-law α is ≤ 2 (HT-SR's over-fit boundary);
- ``<signal>_min`` / ``_max``: the extreme of a series; ``<signal>_frac``: the first checkpoint where
  the series has made a fraction q of its whole change since the initialisation; ``<signal>_plateau``:
  the first checkpoint whose step change is at most q times the largest one (q chosen on other runs);
- ``gated``: a regime detector from the weights (mean log-norm falling from the first trained
  checkpoint to the last: the BatchNorm + weight-decay regime; rising otherwise) picks, per regime,
  the rule with the lowest regret on the other runs of that regime;
- ``vote``: the median of the checkpoints chosen by ``h_star_loo``, ``bfe_last_min`` and ``log_norm_plateau``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Optional, Sequence

import numpy as np

from wbfe.errors import InvalidOptionError, unknown_name

__all__ = [
    "RunSignals",
    "Rule",
    "RULES",
    "SERIES",
    "run_signals",
    "detect_regime",
    "apply_rule",
    "evaluate_rules",
    "shipped_table",
    "rule_names",
]

# Run-level series, each a mean over the matrices finite at every checkpoint (see run_signals).
SERIES = ("log_mean_e", "bfe_last", "bfe_first", "bfe_opt", "alpha", "alpha_weighted", "log_norm",
          "log_spectral_norm", "log_stable_rank", "rand_distance")
FRACTIONS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
PLATEAUS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
LAMBDAS = tuple(float(x) for x in np.geomspace(1e-3, 1e3, 61))


@dataclass(frozen=True)
class RunSignals:
    """A run reduced to what the rules read (no test metric).

    Attributes:
        name: the run's name.
        steps: the checkpoints' steps.
        series: run-level series, one value per checkpoint (:data:`SERIES`), NaN where unknown.
        log_ratio: (checkpoints, matrices) log(h/h*(1)) of each matrix (NaN where its HTMP fit failed).
        lam_first: per matrix, λ* = 1/mean(e) at the first checkpoint.
        lam_fanin: per matrix, fan-in / max(rows, cols): λ of a Gaussian prior of variance 1/fan-in.
    """

    name: str
    steps: tuple[int, ...]
    series: dict[str, np.ndarray]
    log_ratio: np.ndarray
    lam_first: np.ndarray
    lam_fanin: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN as None); :meth:`from_dict` reads it back."""
        def clean(a: np.ndarray) -> Any:
            return [None if not math.isfinite(float(v)) else float(v) for v in np.ravel(a)]

        return {"name": self.name, "steps": list(self.steps),
                "series": {k: clean(v) for k, v in self.series.items()},
                "log_ratio": [clean(row) for row in self.log_ratio],
                "lam_first": clean(self.lam_first), "lam_fanin": clean(self.lam_fanin)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSignals":
        def arr(x: Any) -> np.ndarray:
            return np.array([math.nan if v is None else v for v in x], dtype=float)

        ratio = np.array([arr(row) for row in d["log_ratio"]], dtype=float).reshape(len(d["steps"]), -1)
        return cls(d["name"], tuple(int(s) for s in d["steps"]), {k: arr(v) for k, v in d["series"].items()},
                   ratio, arr(d["lam_first"]), arr(d["lam_fanin"]))


def _run_mean(values: np.ndarray) -> np.ndarray:
    # The same matrices at every checkpoint, so the series is comparable along the run.
    if values.size == 0:
        return np.full(values.shape[0], np.nan)
    keep = np.all(np.isfinite(values), axis=0)
    return values[:, keep].mean(axis=1) if keep.any() else np.full(values.shape[0], np.nan)


def run_signals(traj: Any) -> RunSignals:
    """The :class:`RunSignals` of a scored :class:`~wbfe.watch.trajectories.Trajectory`.

    Only matrices with at least ``min_eigs`` eigenvalues (the ones an HTMP fit can use) enter; a
    trajectory scored without that count keeps every selected matrix.
    """
    from wbfe.watch.guidance import bfe_at_many

    names = traj.layer_names
    counts = traj.matrix(lambda x: float(x.n_eigs)) if traj.points else np.zeros((0, 0))
    min_eigs = max((p.min_eigs for p in traj.points), default=0)
    keep = np.array([bool(np.all((counts[:, j] >= min_eigs) | ~np.isfinite(counts[:, j]))) for j in range(len(names))],
                    dtype=bool)
    if not keep.any():
        keep = np.ones(len(names), dtype=bool)

    def mat(fn: Callable[[Any], float]) -> np.ndarray:
        return traj.matrix(fn)[:, keep]

    def extra(key: str) -> Callable[[Any], float]:
        return lambda x: float(x.extra.get(key, math.nan))

    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(mat(lambda x: x.h) / mat(lambda x: x.h_star(1.0)))
        lam_star = mat(lambda x: x.lambda_star)
        bfe_opt = mat(lambda x: x.bfe_opt)
        rows, cols = mat(extra("rows")), mat(extra("cols"))
        # The shape is the same at every checkpoint: the first one with it known.
        ratio = cols / np.maximum(rows, cols)
        lam_fanin = np.array([next((v for v in ratio[:, j] if math.isfinite(v)), math.nan)
                              for j in range(ratio.shape[1])]) if len(ratio) else np.zeros(0)

        def fixed(at: int) -> np.ndarray:
            lam = lam_star[at] if len(lam_star) else np.zeros(0)
            return _run_mean(bfe_at_many(bfe_opt, lam_star, lam[None, :]))

        series = {
            "log_mean_e": _run_mean(-np.log(lam_star)), "bfe_last": fixed(-1), "bfe_first": fixed(0),
            "bfe_opt": _run_mean(bfe_opt), "alpha": _run_mean(mat(lambda x: x.alpha)),
            "alpha_weighted": _run_mean(mat(extra("alpha_weighted"))), "log_norm": _run_mean(mat(extra("log_norm"))),
            "log_spectral_norm": _run_mean(mat(extra("log_spectral_norm"))),
            "log_stable_rank": _run_mean(np.log10(mat(extra("stable_rank")))),
            "rand_distance": _run_mean(mat(extra("rand_distance"))),
        }
    return RunSignals(traj.run, tuple(traj.steps), series, log_ratio,
                      lam_star[0] if len(lam_star) else np.zeros(0), np.asarray(lam_fanin, dtype=float))


def detect_regime(sig: RunSignals) -> str:
    """``shrinking`` when the mean log-norm falls from the first trained checkpoint to the last, else ``growing``.

    The first checkpoint is often the initialisation, whose scale is the initialiser's choice, so the
    trend is read from the second checkpoint on (from the first when there are only two).
    """
    s = sig.series.get("log_norm", np.array([]))
    finite = np.flatnonzero(np.isfinite(s))
    if finite.size < 2:
        return "growing"
    start = finite[1] if finite.size > 2 else finite[0]
    return "shrinking" if s[finite[-1]] < s[start] else "growing"


# --- the rule forms: each returns (index, reason) -------------------------------------------------------------

Choice = tuple[int, str]


def _last(sig: RunSignals, why: str = "keep the last checkpoint") -> Choice:
    return len(sig.steps) - 1, why


def _first_crossing(sig: RunSignals, log_lam: np.ndarray, label: str) -> Choice:
    with np.errstate(invalid="ignore"):
        stat = np.nanmedian(sig.log_ratio + log_lam[None, :], axis=1) if sig.log_ratio.size else np.array([])
    finite = [t for t in range(1, len(stat)) if math.isfinite(float(stat[t]))]
    if not finite:
        return _last(sig, f"no finite h/h* ({label}): the last checkpoint is kept")
    for t in finite:
        if stat[t] <= 0:
            return t, f"first checkpoint after the first with h ≤ h*(λ) ({label}; median h/h* = {math.exp(stat[t]):.3g})"
    return _last(sig, f"h > h*(λ) at every checkpoint ({label}; last median h/h* = {math.exp(stat[finite[-1]]):.3g}): "
                      "never crossed, the last checkpoint is kept")


def _series(sig: RunSignals, key: str) -> Optional[np.ndarray]:
    s = sig.series.get(key)
    return s if s is not None and np.all(np.isfinite(s)) and s.size >= 2 else None


def _extreme(key: str, sign: float) -> Callable[[RunSignals, Any], Choice]:
    def choose(sig: RunSignals, _: Any) -> Choice:
        s = _series(sig, key)
        if s is None:
            return _last(sig, f"{key} is not finite at every checkpoint: the last checkpoint is kept")
        t = int(np.argmin(sign * s))
        return t, f"{'lowest' if sign > 0 else 'highest'} {key} of the run ({s[t]:.4g})"
    return choose


def _fraction(key: str) -> Callable[[RunSignals, Any], Choice]:
    def choose(sig: RunSignals, q: Any) -> Choice:
        s = _series(sig, key)
        if s is None:
            return _last(sig, f"{key} is not finite at every checkpoint: the last checkpoint is kept")
        total = s[-1] - s[0]
        if total == 0:
            return _last(sig, f"{key} does not change over the run: the last checkpoint is kept")
        done = (s - s[0]) / total
        t = next(i for i in range(1, len(s)) if done[i] >= q or i == len(s) - 1)
        return t, f"first checkpoint where {key} has made {float(q):.0%} of its change over the run ({done[t]:.0%})"
    return choose


def _plateau(key: str) -> Callable[[RunSignals, Any], Choice]:
    def choose(sig: RunSignals, q: Any) -> Choice:
        s = _series(sig, key)
        if s is None:
            return _last(sig, f"{key} is not finite at every checkpoint: the last checkpoint is kept")
        step = np.abs(np.diff(s))
        if step.max() == 0:
            return _last(sig, f"{key} does not change over the run: the last checkpoint is kept")
        t = next((i + 1 for i in range(1, step.size) if step[i] <= q * step.max()), len(s) - 1)
        return t, f"first checkpoint where {key} changes by at most {float(q):g} of its largest step change"
    return choose


def _alpha_cross(sig: RunSignals, _: Any) -> Choice:
    s = sig.series.get("alpha", np.array([]))
    finite = [t for t in range(len(s)) if math.isfinite(float(s[t]))]
    if not finite:
        return _last(sig, "no finite α: the last checkpoint is kept")
    for t in finite:
        if s[t] <= 2.0:
            return t, f"first checkpoint with mean α ≤ 2 ({s[t]:.3g})"
    return _last(sig, f"mean α > 2 at every checkpoint (last {s[finite[-1]]:.3g}): the last checkpoint is kept")


@dataclass(frozen=True)
class Rule:
    """A stopping rule: a name, what it does, its free parameter's grid (empty: none) and its choice."""

    name: str
    description: str
    choose: Callable[[RunSignals, Any], Choice] = field(compare=False)
    grid: tuple[Any, ...] = ()
    composite: bool = False


def _base_rules() -> dict[str, Rule]:
    rules = [
        Rule("last", "keep the last checkpoint", lambda s, _: _last(s)),
        Rule("h_star_first", "first h_t ≤ h*(λ), λ = each matrix's λ* at the first checkpoint",
             lambda s, _: _first_crossing(s, np.log(s.lam_first), "λ from the first checkpoint")),
        Rule("h_star_fanin", "first h_t ≤ h*(λ), λ = fan-in/max(rows, cols) (prior variance 1/fan-in)",
             lambda s, _: _first_crossing(s, np.log(s.lam_fanin), "λ from the fan-in")),
        Rule("h_star_loo", "first h_t ≤ h*(λ), one λ chosen on other runs",
             lambda s, lam: _first_crossing(s, np.full(s.log_ratio.shape[1], math.log(lam)), f"λ = {lam:.3g}"),
             LAMBDAS),
        Rule("bfe_last_min", "minimum of BFE-W at each matrix's λ* of the last checkpoint", _extreme("bfe_last", 1.0)),
        Rule("bfe_first_min", "minimum of BFE-W at each matrix's λ* of the first checkpoint", _extreme("bfe_first", 1.0)),
        Rule("alpha_cross2", "first checkpoint with mean α ≤ 2", _alpha_cross),
    ]
    for key in SERIES:
        rules += [Rule(f"{key}_min", f"minimum of {key}", _extreme(key, 1.0)),
                  Rule(f"{key}_max", f"maximum of {key}", _extreme(key, -1.0)),
                  Rule(f"{key}_frac", f"first checkpoint where {key} has made a fraction q of its change",
                       _fraction(key), FRACTIONS),
                  Rule(f"{key}_plateau", f"first checkpoint where {key}'s step change is ≤ q × its largest",
                       _plateau(key), PLATEAUS)]
    return {r.name: r for r in rules}


RULES: dict[str, Rule] = _base_rules()
RULES["gated"] = Rule("gated", "regime from the weights (log-norm falling or rising), then the rule that did best "
                               "on the other runs of that regime", lambda s, p: _gated(s, p), composite=True)
RULES["vote"] = Rule("vote", "median of the checkpoints chosen by h_star_loo, bfe_last_min and log_norm_plateau",
                     lambda s, p: _vote(s, p), composite=True)
VOTERS = ("h_star_loo", "bfe_last_min", "log_norm_plateau")


def _gated(sig: RunSignals, param: Any) -> Choice:
    regime = detect_regime(sig)
    name, value = param[regime]
    t, why = RULES[name].choose(sig, value)
    return t, f"norms {regime} → {name}: {why}"


def _vote(sig: RunSignals, param: Any) -> Choice:
    picks = sorted(RULES[n].choose(sig, param.get(n))[0] for n in VOTERS)
    t = picks[len(picks) // 2]
    return t, f"median of {', '.join(f'{n}: step {sig.steps[i]}' for n, i in zip(VOTERS, picks))}"


def rule_names() -> list[str]:
    """Every rule's name."""
    return list(RULES)


def apply_rule(sig: RunSignals, name: str, param: Any = None) -> Choice:
    """The checkpoint index rule ``name`` keeps (with ``param`` for rules that have one) and why.

    Raises:
        InvalidOptionError: an unknown rule, or a rule with a parameter and none given.
    """
    if name not in RULES:
        raise unknown_name("stopping rule", name, RULES)
    rule = RULES[name]
    if (rule.grid or rule.composite) and param is None:
        raise InvalidOptionError(f"rule {name} needs its parameter (chosen on measured runs)", option="rule")
    return rule.choose(sig, param)


# --- leave-one-run-out evaluation ------------------------------------------------------------------------------

def _regrets(sigs: Sequence[RunSignals], losses: Sequence[np.ndarray], name: str, param: Any) -> np.ndarray:
    return np.array([loss[apply_rule(s, name, param)[0]] - loss.min() for s, loss in zip(sigs, losses)])


def _middle(grid: Sequence[Any], means: np.ndarray) -> Any:
    # Ties (flat stretches) are common: take the middle of the minimising set.
    best = np.flatnonzero(means <= np.nanmin(means) + 1e-12)
    return grid[int(best[len(best) // 2])]


def tune(sigs: Sequence[RunSignals], losses: Sequence[np.ndarray], name: str) -> tuple[Any, float]:
    """The parameter of rule ``name`` with the lowest mean regret on these runs, and that regret.

    Composite rules tune their parts on the same runs (``gated`` per detected regime).
    """
    rule = RULES[name]
    if not sigs:
        raise InvalidOptionError("tuning a rule needs at least one run")
    if name == "gated":
        param: dict[str, Any] = {}
        regimes = [detect_regime(s) for s in sigs]
        for regime in ("shrinking", "growing"):
            idx = [i for i, r in enumerate(regimes) if r == regime] or list(range(len(sigs)))
            sub_s, sub_l = [sigs[i] for i in idx], [losses[i] for i in idx]
            scored = [(tune(sub_s, sub_l, n)[1], n) for n in RULES if not RULES[n].composite]
            best = min(scored)[1]
            param[regime] = (best, tune(sub_s, sub_l, best)[0])
        return param, float(_regrets(sigs, losses, name, param).mean())
    if name == "vote":
        param = {n: tune(sigs, losses, n)[0] for n in VOTERS}
        return param, float(_regrets(sigs, losses, name, param).mean())
    if not rule.grid:
        return None, float(_regrets(sigs, losses, name, None).mean())
    means = np.array([_regrets(sigs, losses, name, p).mean() for p in rule.grid])
    value = _middle(rule.grid, means)
    return value, float(np.nanmin(means))


@dataclass(frozen=True)
class RuleScore:
    """One rule measured leave-one-run-out: per run, the held-out choice and its regret."""

    name: str
    param_all: Any
    chosen: tuple[int, ...]
    regret: np.ndarray
    hit: np.ndarray


def evaluate_rules(sigs: Sequence[RunSignals], losses: Sequence[np.ndarray],
                   names: Optional[Sequence[str]] = None) -> dict[str, RuleScore]:
    """Every rule leave-one-run-out: its parameter chosen on the other runs, applied to the held-out one.

    Args:
        sigs: the runs' signals.
        losses: each run's test loss per checkpoint (finite).
        names: the rules to evaluate (default all).

    Returns:
        Rule name → :class:`RuleScore` (``param_all``: the parameter chosen on all runs, for new runs).

    Raises:
        InvalidOptionError: fewer than two runs, or a loss series that does not match its run.
    """
    if len(sigs) < 2 or len(sigs) != len(losses):
        raise InvalidOptionError("leave-one-run-out needs at least two runs, each with its test losses")
    losses = [np.asarray(x, dtype=float) for x in losses]
    for s, loss in zip(sigs, losses):
        if loss.size != len(s.steps) or not np.all(np.isfinite(loss)):
            raise InvalidOptionError(f"run {s.name}: every checkpoint needs a finite test loss")
    out = {}
    for name in names or list(RULES):
        chosen, regret = [], []
        for r in range(len(sigs)):
            others = [i for i in range(len(sigs)) if i != r]
            param = tune([sigs[i] for i in others], [losses[i] for i in others], name)[0]
            t = apply_rule(sigs[r], name, param)[0]
            chosen.append(t)
            regret.append(float(losses[r][t] - losses[r].min()))
        hit = np.array([abs(t - int(np.argmin(loss))) <= 1 for t, loss in zip(chosen, losses)])
        out[name] = RuleScore(name, tune(sigs, losses, name)[0], tuple(chosen), np.array(regret), hit)
    return out


# --- the table shipped with the package -----------------------------------------------------------------------

TABLE = "stopping_table.json"


def shipped_table() -> dict[str, Any]:
    """The measured rules shipped in the package (``wbfe/watch/stopping_table.json``).

    Generated by ``benchmarks/bench_early_stopping.py`` from ``benchmarks/results/early_stopping.json``:
    per rule, its parameter chosen on all measured runs and its held-out regret and hit rate; and the
    default rule (the lowest held-out mean regret, or ``last`` when no rule beats keeping the last).
    """
    text = resources.files("wbfe.watch").joinpath(TABLE).read_text(encoding="utf-8")
    return dict(json.loads(text))
