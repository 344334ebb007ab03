"""Early stopping from the weights, measured: every data-free rule of wbfe.watch.stopping, leave-one-run-out.

Reads the runs trained by ``benchmarks/early_stopping/train_runs.py`` (checkpoints in
``benchmarks/early_stopping/runs/``, per-checkpoint test and validation metrics in
``benchmarks/results/early_stopping_runs.csv``), scores every checkpoint once (the matrices ``wbfe
watch --layers fittable`` reads, with the ``rand`` group for the randomised control), and writes:

- ``benchmarks/results/early_stopping_signals.json``: each run's data-free signals (so the evaluation
  can be rerun without the checkpoints: ``--from-signals``);
- ``benchmarks/results/early_stopping.json``: per rule, the held-out regret (test loss at the chosen
  checkpoint − the run's lowest test loss) and hit rate (within one checkpoint of the best), against
  keeping the last checkpoint and a validation-set oracle; per regime, family and data set;
- ``wbfe/watch/stopping_table.json``: the table ``wbfe watch`` ships (parameters chosen on all runs,
  held-out figures, the default rule).

Then ``benchmarks/early_stopping/make_doc.py`` writes ``docs/early_stopping.md`` from the JSON.

    nice -n 10 .venv/bin/python benchmarks/bench_early_stopping.py
    .venv/bin/python benchmarks/bench_early_stopping.py --from-signals    # re-evaluate, no scoring
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
RUNS = REPO / "benchmarks" / "early_stopping" / "runs"
METRICS_CSV = REPO / "benchmarks" / "results" / "early_stopping_runs.csv"
SIGNALS = REPO / "benchmarks" / "results" / "early_stopping_signals.json"
RESULT = REPO / "benchmarks" / "results" / "early_stopping.json"
TABLE = REPO / "wbfe" / "watch" / "stopping_table.json"
SCORE_METRICS = "bfe,htsr,htmp,rand"


def read_metrics() -> dict[str, dict[str, np.ndarray]]:
    """Run name → {"step", "test_loss", "test_accuracy", "val_loss"} arrays in step order."""
    runs: dict[str, list[dict[str, str]]] = {}
    with open(METRICS_CSV, newline="") as fh:
        for row in csv.DictReader(fh):
            runs.setdefault(row["run"], []).append(row)
    out = {}
    for name, rows in runs.items():
        rows.sort(key=lambda r: int(r["step"]))
        out[name] = {k: np.array([float(r[k]) for r in rows]) for k in ("step", "test_loss", "test_accuracy", "val_loss")}
    return out


def describe_run(name: str) -> dict[str, str]:
    """Data set, family, regime and over-fit setting from the run name (train_runs.RunSpec.name)."""
    dataset, family, *rest = name.split("-")
    regime = "bn-sgd" if "bn-sgd" in name else "adam"
    return {"dataset": dataset, "family": family, "regime": regime,
            "setting": "noisy-small" if "noise" in name else "clean"}


def score_runs(names: list[str]) -> list[Any]:
    """Each run's signals, scored once: cached in the (git-ignored) run folder as ``signals.json``."""
    from wbfe.watch import trajectory
    from wbfe.watch.stopping import RunSignals, run_signals

    sigs = []
    for name in names:
        cache = RUNS / name / "signals.json"
        if cache.is_file() and cache.stat().st_mtime > (RUNS / name / "metrics.csv").stat().st_mtime:
            sigs.append(RunSignals.from_dict(json.loads(cache.read_text())))
            continue
        t0 = time.perf_counter()
        traj = trajectory(RUNS / name, layers="fittable", device="cpu", metrics=SCORE_METRICS)
        sig = run_signals(traj)
        sig = RunSignals(name, sig.steps, sig.series, sig.log_ratio, sig.lam_first, sig.lam_fanin)
        cache.write_text(json.dumps(sig.to_dict()) + "\n")
        sigs.append(sig)
        print(f"scored {name}: {len(traj.points)} checkpoints in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
              flush=True)
    return sigs


def _stats(regret: np.ndarray, hit: np.ndarray, last: np.ndarray) -> dict[str, Any]:
    return {"n": int(regret.size), "regret_mean": float(regret.mean()), "regret_median": float(np.median(regret)),
            "hit_rate": float(hit.mean()), "better_than_last": int(np.sum(regret < last - 1e-12)),
            "worse_than_last": int(np.sum(regret > last + 1e-12))}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


def evaluate(sigs: list[Any], metrics: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    from wbfe.watch.stopping import RULES, Measured, detect_regime, evaluate_rules, select_held_out

    names = [s.name for s in sigs]
    losses = [metrics[n]["test_loss"] for n in names]
    for s, n in zip(sigs, names):
        if list(s.steps) != metrics[n]["step"].astype(int).tolist():
            raise SystemExit(f"{n}: the checkpoints' steps differ from the metrics CSV's")
    t0 = time.perf_counter()
    scores = evaluate_rules(sigs, losses)
    seconds = time.perf_counter() - t0
    best = [int(np.argmin(x)) for x in losses]
    last = scores["last"].regret
    oracle_idx = [int(np.argmin(metrics[n]["val_loss"])) for n in names]
    oracle = np.array([loss[i] - loss.min() for loss, i in zip(losses, oracle_idx)])
    oracle_hit = np.array([abs(i - b) <= 1 for i, b in zip(oracle_idx, best)])
    info = [describe_run(n) | {"detected_regime": detect_regime(s)} for n, s in zip(names, sigs)]
    groups: dict[str, dict[str, list[int]]] = {}
    for key in ("regime", "family", "dataset", "setting", "detected_regime"):
        for i, d in enumerate(info):
            groups.setdefault(key, {}).setdefault(d[key], []).append(i)

    def block(regret: np.ndarray, hit: np.ndarray) -> dict[str, Any]:
        out = {"all": _stats(regret, hit, last)}
        for key, parts in groups.items():
            out[key] = {g: _stats(regret[idx], hit[idx], last[idx]) for g, idx in parts.items()}
        return out

    rules = {}
    for name, sc in scores.items():
        rules[name] = {"description": RULES[name].description, "param_all_runs": sc.param_all,
                       **block(sc.regret, sc.hit),
                       "runs": {n: {"chosen_step": int(s.steps[t]), "regret": float(r)}
                                for n, s, t, r in zip(names, sigs, sc.chosen, sc.regret)}}
    # The default procedure itself, held out: for each run, the rule with the lowest leave-one-run-out regret on
    # the other runs (nested), applied to it: the figure to quote for "the default" on a new run.
    t1 = time.perf_counter()
    auto_pick, auto = select_held_out(sigs, losses)
    seconds += time.perf_counter() - t1
    # A regime detector wbfe does not ship yet: BatchNorm present in the checkpoint (here read from the run's
    # design, which is what its tensor names show), gating as `gated` does with the norm trend.
    m = Measured(sigs, losses)
    m.regimes = ["shrinking" if describe_run(n)["regime"] == "bn-sgd" else "growing" for n in names]
    bn_chosen = m.held_out("gated")
    bn_regret = m.regrets(bn_chosen)
    bn_hit = np.array([abs(int(t) - b) <= 1 for t, b in zip(bn_chosen, best)])
    ranked = sorted((v["all"]["regret_mean"], k) for k, v in rules.items())
    # The default must beat keeping the last held out twice over: as a rule (its parameter chosen on the other
    # runs) and as the choice of a rule among all of them (nested: the choice made on the other runs).
    last_mean = rules["last"]["all"]["regret_mean"]
    beats = ranked[0][0] < last_mean - 1e-12 and float(auto.regret.mean()) < last_mean - 1e-12
    default = ranked[0][1] if beats else "last"
    return {
        "script": "benchmarks/bench_early_stopping.py", "score_metrics": SCORE_METRICS, "layers": "fittable",
        "evaluation_seconds": round(seconds, 1),
        "definitions": {
            "regret": "test loss at the chosen checkpoint minus the run's lowest test loss",
            "hit": "the chosen checkpoint is within one checkpoint of the lowest test loss",
            "held_out": "a rule's free parameter is chosen on the other runs (leave-one-run-out)",
            "validation_oracle": "the checkpoint with the lowest validation loss (a held-out split of the "
                                 "training pool: what data-based early stopping would pick)",
        },
        "runs": [{"run": n, **d, "checkpoints": len(s.steps), "best_step": int(s.steps[b]),
                  "min_test_loss": float(loss.min()), "last_test_loss": float(loss[-1]),
                  "overfits": bool(loss[-1] - loss.min() > 0.02)}
                 for n, d, s, b, loss in zip(names, info, sigs, best, losses)],
        "baselines": {"last": block(last, scores["last"].hit), "validation_oracle": block(oracle, oracle_hit)},
        "rules": rules,
        "gated_by_batchnorm": {"description": "not shipped: per held-out run, BatchNorm present in the checkpoint "
                                              "or not picks the rule (and parameter) that did best on the other "
                                              "runs of that kind", "param_all_runs": m.tune("gated", range(m.n))[0],
                               **block(bn_regret, bn_hit)},
        "ranking": [k for _, k in ranked],
        "default": default,
        "auto_selection": {"description": "per held-out run, the rule with the lowest leave-one-run-out regret on "
                                          "the other runs (nested; parameters tuned there), applied to it",
                           **block(auto.regret, auto.hit),
                           "picks": dict(zip(names, auto_pick))},
    }


def shipped(result: dict[str, Any]) -> dict[str, Any]:
    """The small table the package ships: per rule, parameter on all runs and held-out figures."""
    def fig(block: dict[str, Any]) -> dict[str, Any]:
        a = block["all"]
        return {k: a[k] for k in ("n", "regret_mean", "regret_median", "hit_rate", "better_than_last",
                                  "worse_than_last")}

    return {"generated_by": result["script"], "from": "benchmarks/results/early_stopping.json",
            "runs": len(result["runs"]), "layers": result["layers"], "score_metrics": result["score_metrics"],
            "default": result["default"], "best_rule": result["ranking"][0] if result["ranking"][0] != "last"
            else result["ranking"][1], "keep_last": fig(result["baselines"]["last"]),
            "auto_selection": fig(result["auto_selection"]),
            "validation_oracle": fig(result["baselines"]["validation_oracle"]),
            "rules": {k: {"description": v["description"], "param": v["param_all_runs"], **fig(v)}
                      for k, v in result["rules"].items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-signals", action="store_true", help="re-evaluate from the committed signals")
    parser.add_argument("--score-only", nargs="*", metavar="RUN",
                        help="only score (and cache) these finished runs, e.g. while others still train")
    args = parser.parse_args(argv)
    if args.score_only is not None:
        import torch

        torch.set_num_threads(1)
        score_runs(args.score_only)
        return 0
    import torch

    from wbfe.watch.stopping import RunSignals

    torch.set_num_threads(1)
    metrics = read_metrics()
    names = sorted(metrics)
    t0 = time.perf_counter()
    if args.from_signals:
        stored = {d["name"]: RunSignals.from_dict(d) for d in json.loads(SIGNALS.read_text())["runs"]}
        sigs = [stored[str(RUNS / n)] if str(RUNS / n) in stored else stored[n] for n in names]
    else:
        sigs = score_runs(names)
        SIGNALS.write_text(json.dumps({"score_metrics": SCORE_METRICS, "layers": "fittable",
                                       "scoring_seconds": round(time.perf_counter() - t0, 1),
                                       "runs": [s.to_dict() for s in sigs]}) + "\n")
    result = _jsonable(evaluate(sigs, metrics))
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    TABLE.write_text(json.dumps(_jsonable(shipped(result)), indent=1) + "\n")
    print(f"wrote {RESULT} and {TABLE}; default rule: {result['default']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
