"""Recommend a checkpoint by a measured data-free stopping rule (:mod:`.stopping`, table ``stopping_table.json``),
with the figures that say how far to trust it.
"""

from __future__ import annotations

from typing import Any, Optional

from wbfe.errors import InvalidOptionError, unknown_name
from wbfe.watch.rule import Recommendation
from wbfe.watch.stopping import RULES, apply_rule, run_signals, shipped_table
from wbfe.watch.trajectories import METRICS, Trajectory, WatchResult

__all__ = ["result_by_rule", "rule_metrics", "resolve_rule"]


def resolve_rule(rule: Optional[str], table: Optional[dict[str, Any]] = None) -> tuple[str, dict[str, Any]]:
    """The rule's name (the table's default for None) and its row of the shipped table.

    Raises:
        InvalidOptionError: an unknown rule, or one the table has no measurement of.
    """
    table = shipped_table() if table is None else table
    name = table["default"] if rule is None else rule
    if name not in RULES:
        raise unknown_name("stopping rule", name, RULES)
    if name not in table["rules"]:
        raise InvalidOptionError(f"rule {name} has no measurement in the shipped table: rerun "
                                 "benchmarks/bench_early_stopping.py", option="rule")
    return name, table["rules"][name]


def _reads_rand(name: str, param: Any) -> bool:
    """Whether a rule (itself, or a composite's parts) reads the randomised control."""
    parts = {str(v[0]) for v in dict(param).values()} if name == "gated" else dict(param) if name == "vote" else [name]
    return any(n.startswith("rand_") for n in parts)


def rule_metrics(rule: Optional[str] = None) -> str:
    """The metric groups to score for ``rule`` (``rand`` only when it reads the randomised control)."""
    name, row = resolve_rule(rule)
    return METRICS + (",rand" if _reads_rand(name, row["param"]) else "")


def _fig(block: dict[str, Any]) -> str:
    return (f"mean regret {block['regret_mean']:.4f} (median {block['regret_median']:.4f}), "
            f"hit rate {block['hit_rate']:.0%}")


def result_by_rule(traj: Trajectory, rule: Optional[str] = None, *, layers: str = "fittable",
                   table: Optional[dict[str, Any]] = None) -> WatchResult:
    """Apply a measured stopping rule (None: the table's default) to a trajectory scored with :func:`rule_metrics`;
    ``layers`` is the selection it was scored with (the figures were measured with ``fittable``; another is said
    so); ``table`` defaults to the shipped one. The result's ``stopping`` holds the rule, parameter and figures.

    Raises:
        InvalidOptionError: an unknown or unmeasured rule, an empty trajectory, or one scored without the randomised
            control the rule reads.
    """
    table = shipped_table() if table is None else table
    name, row = resolve_rule(rule, table)
    if not traj.points:
        raise InvalidOptionError(f"{traj.run}: no checkpoints to choose from")
    if _reads_rand(name, row["param"]) and not any("rand_distance" in x.extra for p in traj.points for x in p.layers):
        # every rand_distance was NaN: the rule kept the last checkpoint, "not finite at every checkpoint"
        raise InvalidOptionError(f"{traj.run}: rule {name} reads rand_distance, and the run was scored without it; "
                                 "score it with metrics=rule_metrics(rule)", option="rule")
    index, reason = apply_rule(run_signals(traj), name, row["param"])
    last, oracle, runs = table["keep_last"], table["validation_oracle"], table["runs"]
    if rule is None and name == "last":
        best = min((v["regret_mean"], k) for k, v in table["rules"].items() if k != "last")
        line = (f"keep the last checkpoint — no data-free rule beat it on {runs} held-out runs (best single rule: "
                f"{best[1]}, mean regret {best[0]:.4f} against {last['regret_mean']:.4f}")
        auto = table.get("auto_selection")
        if auto is not None and best[0] < last["regret_mean"]:
            line += f", but a rule chosen on the other runs, applied to the held-out one, {auto['regret_mean']:.4f}"
        line += "); choose another with --rule NAME"
    else:
        how = "default: the lowest held-out regret" if rule is None else "chosen with --rule"
        line = f"{name} ({how}) — {row['description']}"
    lines = [line, f"held out on {runs} measured runs: {_fig(row)}; keep the last: {_fig(last)}; "
                   f"validation-set oracle: {_fig(oracle)} (regret = test loss − the run's lowest)"]
    if layers != table["layers"]:
        lines.append(f"note: measured with --layers {table['layers']}; this run used --layers {layers}")
    held = ("n", "regret_mean", "regret_median", "hit_rate", "better_than_last", "worse_than_last")
    stopping = {"name": name, "description": row["description"], "default": rule is None, "param": row["param"],
                "held_out": {k: row[k] for k in held}, "keep_last": last, "validation_oracle": oracle,
                "measured_runs": runs, "measured_layers": table["layers"], "lines": lines}
    rec = Recommendation(index, traj.steps[index], False, reason)
    return WatchResult(traj, None, None, rec, layers, stopping)
