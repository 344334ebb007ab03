"""Data-free stopping rules: which checkpoint of a run to keep, from its weights alone, and how each is measured
leave-one-run-out by its regret (the rules and their measured figures: docs/early_stopping.md)."""

from __future__ import annotations

import functools
import json
import math
import warnings
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from wbfe.errors import InvalidOptionError, unknown_name
from wbfe.watch.guidance import run_mean, bfe_at_many
from wbfe.watch.rule import middle_of_ties

__all__ = ["RunSignals", "Rule", "RULES", "SERIES", "run_signals", "detect_regime", "apply_rule", "evaluate_rules",
           "select_held_out", "Measured", "shipped_table"]

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
        from wbfe.render.text import json_ready

        return json_ready(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSignals":
        arr = functools.partial(np.array, dtype=float)  # None reads as NaN
        return cls(d["name"], tuple(int(s) for s in d["steps"]), {k: arr(v) for k, v in d["series"].items()},
                   arr(d["log_ratio"]).reshape(len(d["steps"]), -1), arr(d["lam_first"]), arr(d["lam_fanin"]))


def run_signals(traj: Any) -> RunSignals:
    """The :class:`RunSignals` of a scored trajectory, over its matrices with at least ``min_eigs`` eigenvalues."""
    counts = traj.matrix(lambda x: float(x.n_eigs))
    min_eigs = max((p.min_eigs for p in traj.points), default=0)
    keep = np.all((counts >= min_eigs) | ~np.isfinite(counts), axis=0)
    keep = keep if keep.any() else np.ones_like(keep)

    def mat(fn: Callable[[Any], float]) -> np.ndarray:
        return traj.matrix(fn)[:, keep]

    def extra(key: str) -> np.ndarray:
        return mat(lambda x: float(x.extra.get(key, math.nan)))

    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(mat(lambda x: x.h) / mat(lambda x: x.h_star(1.0)))
        lam_star = mat(lambda x: x.lambda_star)
        bfe_opt = mat(lambda x: x.bfe_opt)
        # The shape is the same at every checkpoint: the first one with it known.
        ratio = extra("cols") / np.maximum(extra("rows"), extra("cols"))
        lam_fanin = np.array([next((v for v in ratio[:, j] if math.isfinite(v)), math.nan)
                              for j in range(ratio.shape[1])]) if len(ratio) else np.zeros(0)

        def fixed(at: int) -> np.ndarray:
            lam = lam_star[at] if len(lam_star) else np.zeros(0)
            return run_mean(bfe_at_many(bfe_opt, lam_star, lam[None, :]))

        series = {"log_mean_e": run_mean(-np.log(lam_star)), "bfe_last": fixed(-1), "bfe_first": fixed(0),
                  "bfe_opt": run_mean(bfe_opt), "alpha": run_mean(mat(lambda x: x.alpha)),
                  **{k: run_mean(extra(k)) for k in ("alpha_weighted", "log_norm", "log_spectral_norm")},
                  "log_stable_rank": run_mean(np.log10(extra("stable_rank"))),
                  "rand_distance": run_mean(extra("rand_distance"))}
    return RunSignals(traj.run, tuple(traj.steps), series, log_ratio,
                      lam_star[0] if len(lam_star) else np.zeros(0), np.asarray(lam_fanin, dtype=float))


def detect_regime(sig: RunSignals) -> str:
    """``shrinking`` when the mean log-norm falls from the first trained checkpoint to the last, else ``growing``."""
    # The first checkpoint is often the initialisation, whose scale is the initialiser's choice.
    s = sig.series.get("log_norm", np.array([]))
    finite = np.flatnonzero(np.isfinite(s))
    if finite.size < 2:
        return "growing"
    start = finite[1] if finite.size > 2 else finite[0]
    return "shrinking" if s[finite[-1]] < s[start] else "growing"


Choice = tuple[int, str]  # what a rule form returns: (checkpoint index, reason)


def _last(sig: RunSignals, why: str = "keep the last checkpoint") -> Choice:
    return len(sig.steps) - 1, why


def _first_crossing(sig: RunSignals, log_lam: np.ndarray, label: str) -> Choice:
    with warnings.catch_warnings():  # a checkpoint with no finite ratio is NaN, and skipped below
        warnings.simplefilter("ignore", RuntimeWarning)
        stat = np.nanmedian(sig.log_ratio + log_lam[None, :], axis=1) if sig.log_ratio.size else np.array([])
    finite = [t for t in range(1, len(stat)) if math.isfinite(float(stat[t]))]
    if not finite:
        return _last(sig, f"no finite h/h* ({label}): the last checkpoint is kept")
    for t in finite:
        if stat[t] <= 0:
            return t, f"first checkpoint after the first with h ≤ h*(λ) ({label}; median h/h* = {math.exp(stat[t]):.3g})"
    return _last(sig, f"h > h*(λ) at every checkpoint ({label}; last median h/h* = {math.exp(stat[finite[-1]]):.3g}): "
                      "never crossed, the last checkpoint is kept")


SeriesRule = Callable[[RunSignals, np.ndarray, Any], Optional[Choice]]


def _on_series(key: str, rule: SeriesRule) -> Callable[[RunSignals, Any], Choice]:
    """A rule on series ``key``: the last checkpoint where it is not finite throughout, or ``rule`` returns None."""
    def choose(sig: RunSignals, param: Any) -> Choice:
        s = sig.series.get(key)
        if s is None or not np.all(np.isfinite(s)) or s.size < 2:
            return _last(sig, f"{key} is not finite at every checkpoint: the last checkpoint is kept")
        return rule(sig, s, param) or _last(sig, f"{key} does not change over the run: the last checkpoint is kept")
    return choose


def _extreme(key: str, sign: float) -> Callable[[RunSignals, Any], Choice]:
    def rule(sig: RunSignals, s: np.ndarray, _: Any) -> Choice:
        t = int(np.argmin(sign * s))
        return t, f"{'lowest' if sign > 0 else 'highest'} {key} of the run ({s[t]:.4g})"
    return _on_series(key, rule)


def _fraction(key: str) -> Callable[[RunSignals, Any], Choice]:
    def rule(sig: RunSignals, s: np.ndarray, q: Any) -> Optional[Choice]:
        if s[-1] == s[0]:
            return None
        done = (s - s[0]) / (s[-1] - s[0])
        t = next(i for i in range(1, len(s)) if done[i] >= q or i == len(s) - 1)
        return t, f"first checkpoint where {key} has made {float(q):.0%} of its change over the run ({done[t]:.0%})"
    return _on_series(key, rule)


def _plateau(key: str) -> Callable[[RunSignals, Any], Choice]:
    def rule(sig: RunSignals, s: np.ndarray, q: Any) -> Optional[Choice]:
        step = np.abs(np.diff(s))
        if step.max() == 0:
            return None
        t = next((i + 1 for i in range(1, step.size) if step[i] <= q * step.max()), len(s) - 1)
        return t, f"first checkpoint where {key} changes by at most {float(q):g} of its largest step change"
    return _on_series(key, rule)


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
        Rule("h_star_first", "first h_t ≤ h*(λ), λ per matrix such that h = h*(λ) at the first checkpoint "
                             "(fires when h/h* falls below its first value)",
             lambda s, _: _first_crossing(s, -s.log_ratio[0] if len(s.log_ratio) else np.zeros(0),
                                          "λ from the first checkpoint")),
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
    picks = [RULES[n].choose(sig, param.get(n))[0] for n in VOTERS]
    t = sorted(picks)[len(picks) // 2]
    return t, f"median of {', '.join(f'{n}: step {sig.steps[i]}' for n, i in zip(VOTERS, picks))}"


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


class Measured:
    """Every rule's choice on every run at every parameter, computed once; tuning is then arithmetic
    (a base rule's choice on a run does not depend on the other runs)."""

    def __init__(self, sigs: Sequence[RunSignals], losses: Sequence[np.ndarray]) -> None:
        if len(sigs) < 2 or len(sigs) != len(losses):
            raise InvalidOptionError("leave-one-run-out needs at least two runs, each with its test losses")
        self.losses = [np.asarray(x, dtype=float) for x in losses]
        for s, loss in zip(sigs, self.losses):
            if loss.size != len(s.steps) or not np.all(np.isfinite(loss)):
                raise InvalidOptionError(f"run {s.name}: every checkpoint needs a finite test loss")
        self.n = len(sigs)
        self.regimes = [detect_regime(s) for s in sigs]
        self.choice = {name: np.array([[apply_rule(s, name, p)[0] for s in sigs] for p in rule.grid or (None,)],
                                      dtype=int) for name, rule in RULES.items() if not rule.composite}
        self.regret = {name: np.array([self.regrets(c) for c in chosen]) for name, chosen in self.choice.items()}

    def _base(self, name: str, subset: Sequence[int]) -> tuple[int, float]:
        means = self.regret[name][:, list(subset)].mean(axis=1)
        k = middle_of_ties(means)
        return k, float(means[k])

    def tune(self, name: str, subset: Sequence[int]) -> tuple[Any, np.ndarray]:
        """Rule ``name``'s parameter chosen on the runs ``subset`` (a composite's parts too), and its choice on
        every run."""
        subset = list(subset)
        if name == "gated":
            param: dict[str, Any] = {}
            chosen = np.zeros(self.n, dtype=int)
            for regime in ("shrinking", "growing"):
                idx = [i for i in subset if self.regimes[i] == regime] or subset
                best = min((self._base(n, idx)[1], n) for n in self.choice)[1]
                k = self._base(best, idx)[0]
                param[regime] = [best, (RULES[best].grid or (None,))[k]]
                mine = [i for i in range(self.n) if self.regimes[i] == regime]
                chosen[mine] = self.choice[best][k][mine]
            return param, chosen
        if name == "vote":
            ks = {n: self._base(n, subset)[0] for n in VOTERS}
            param = {n: (RULES[n].grid or (None,))[k] for n, k in ks.items()}
            votes = np.sort(np.array([self.choice[n][k] for n, k in ks.items()]), axis=0)
            return param, votes[len(VOTERS) // 2]
        k = self._base(name, subset)[0]
        return (RULES[name].grid or (None,))[k], self.choice[name][k]

    def regrets(self, chosen: Union[Sequence[int], np.ndarray], runs: Optional[Sequence[int]] = None) -> np.ndarray:
        """Per run of ``runs`` (default all), the regret of keeping checkpoint ``chosen[k]`` of the k-th."""
        runs = range(self.n) if runs is None else runs
        return np.array([self.losses[r][t] - self.losses[r].min() for t, r in zip(chosen, runs)])

    def held_out(self, name: str, runs: Optional[Sequence[int]] = None) -> np.ndarray:
        """Per run of ``runs`` (default all), the checkpoint rule ``name`` keeps with its parameter tuned on
        the other runs of ``runs``."""
        runs = list(range(self.n)) if runs is None else list(runs)
        return np.array([self.tune(name, [i for i in runs if i != r])[1][r] for r in runs], dtype=int)


@dataclass(frozen=True)
class RuleScore:
    """One rule measured leave-one-run-out: per run, the held-out choice and its regret."""

    name: str
    param_all: Any
    chosen: tuple[int, ...]
    regret: np.ndarray
    hit: np.ndarray


def _hits(m: Measured, chosen: Any, runs: Sequence[int]) -> np.ndarray:
    return np.array([abs(int(t) - int(np.argmin(m.losses[r]))) <= 1 for t, r in zip(chosen, runs)])


def evaluate_rules(sigs: Sequence[RunSignals], losses: Sequence[np.ndarray],
                   names: Optional[Sequence[str]] = None) -> dict[str, RuleScore]:
    """Every rule (``names``, default all) leave-one-run-out: its parameter chosen on the other runs, applied to
    the held-out one; ``losses`` are each run's finite test losses per checkpoint.

    Returns:
        Rule name → :class:`RuleScore` (``param_all``: the parameter chosen on all runs, for new runs).

    Raises:
        InvalidOptionError: fewer than two runs, or a loss series that does not match its run.
    """
    m = Measured(sigs, losses)
    runs = list(range(m.n))
    out = {}
    for name in names or list(RULES):
        chosen = m.held_out(name)
        out[name] = RuleScore(name, m.tune(name, runs)[0], tuple(int(t) for t in chosen), m.regrets(chosen),
                              _hits(m, chosen, runs))
    return out


def select_held_out(sigs: Sequence[RunSignals], losses: Sequence[np.ndarray]) -> tuple[list[str], RuleScore]:
    """The whole default procedure, held out: for each run, the rule with the lowest leave-one-run-out
    regret on the *other* runs (nested), tuned on them and applied to it; returns (picks, ``auto`` score)."""
    m = Measured(sigs, losses)
    picks, chosen = [], []
    for r in range(m.n):
        others = [i for i in range(m.n) if i != r]
        # ties: keep the last
        pick = min((float(np.mean(m.regrets(m.held_out(n, others), others))), n != "last", n) for n in RULES)[2]
        picks.append(pick)
        chosen.append(int(m.tune(pick, others)[1][r]))
    return picks, RuleScore("auto", None, tuple(chosen), m.regrets(chosen), _hits(m, chosen, range(m.n)))


def shipped_table() -> dict[str, Any]:
    """The measured rules shipped in the package (``stopping_table.json``, by ``benchmarks/bench_early_stopping.py``):
    per rule its parameter chosen on all runs and held-out figures, and the default rule."""
    return dict(json.loads(resources.files("wbfe.watch").joinpath("stopping_table.json").read_text(encoding="utf-8")))
