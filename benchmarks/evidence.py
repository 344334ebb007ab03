"""Score every zoo the project ships or trains and write docs/evidence.md: each metric's Spearman ρ
against measured accuracy, on all models and split by BFE-W applicability status (issue #30).

The shipped zoos are bare safetensors files, which describe no model: scored as files every model is
``unknown``. Their architectures are known all the same (the Fashion-MNIST headers state them; the
CIFAR ResNets are akamaster's standard definition), so each zoo is ranked twice through the public
:func:`wbfe.rank`: once as the files (``view: file``), once as the rebuilt ``nn.Module`` with the
file's weights loaded strictly (``view: module``), whose status :mod:`wbfe.framework.applicability` reads from
the module graph. The scores of both views are the same numbers (the module's weights are the file's);
the script records the largest difference it finds. No rule, metric or setting is chosen here from
the outcome: the statuses come from the architecture, the statistics are
:func:`wbfe.ranking.correlate`'s defaults.

    python benchmarks/evidence.py            # score every zoo (~1 min), write the JSON and the page
    python benchmarks/evidence.py --render   # rewrite docs/evidence.md from the JSON only
    python benchmarks/evidence.py --check    # exit 1 if docs/evidence.md is out of date

Zoos: ``fmnist`` (fixtures/fmnist-zoo, 33 models), ``fmnist-dropout`` (fixtures/fmnist-dropout-zoo,
20 models, half with dropout before the head: benchmarks/zoo/train_dropout_zoo.py), both Fashion-MNIST
zoos together (``fmnist-all``, module view: the same task and quality measure), and
``cifar10-resnet`` (``$WBFE_SHARED_ZOO/cifar10-resnet``, 4 models; left out, with the reason, where it
is absent).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "evidence.json"
OUTPUT = ROOT / "docs" / "evidence.md"
COMMAND = "python benchmarks/evidence.py"
STATUSES = ("holds", "fails", "unknown")
# rank's default groups (bfe, htsr) and the HTMP fit (its summary columns h, f_inf, htmp_kappa).
METRICS = "bfe,htsr,htmp"
# The BFE-W paper (arXiv 2610.13123), as wbfe.framework.applicability quotes it: Spearman ρ of BFE-W with accuracy.
PAPER = (
    ("standard conv nets (ResNet, RegNet, ResNeXt)", "holds", "−0.71 to −1.00"),
    ("dropout before the last layer (VGG, EfficientNet, MNASNet)", "fails", "0.00 (overall)"),
    ("vision transformers (ViT, Swin)", "fails", "+0.14"),
    ("Pythia (decoder LM)", "holds", "−0.66"),
    ("Qwen3.5 (decoder LM, dual BFE-W)", "holds", "−0.77"),
)
Builder = Callable[[str], Any]  # a checkpoint path -> the nn.Module it holds, weights loaded


# --- the zoos ------------------------------------------------------------------------------------


def fmnist_module(path: str) -> Any:
    """The Fashion-MNIST network a zoo file's header states, with the file's weights (strict)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from benchmarks.fashion_mnist.models import ArchSpec, build_model

    with safe_open(path, "pt") as fh:
        meta = fh.metadata()
    model = build_model(ArchSpec.from_metadata(meta))
    model.load_state_dict(load_file(path), strict=True)
    return model.eval()


def cifar_module(path: str) -> Any:
    """The CIFAR ResNet of a shared-zoo file (akamaster's definition), its weights loaded strictly."""
    from benchmarks.cifar_resnet.models import load_resnet

    return load_resnet(path)


def zoos() -> dict[str, tuple[str, Callable[[], Any], Builder]]:
    """key -> (title, loader of the :class:`~wbfe.ranking.Zoo`, builder of a file's module)."""
    from wbfe.ranking import load_zoo
    from wbfe.ranking.zoo import read_zoo_file

    return {
        "fmnist": ("Fashion-MNIST zoo (fixtures/fmnist-zoo: 20 MLPs, 13 CNNs, none with dropout)",
                   lambda: load_zoo("fmnist"), fmnist_module),
        "fmnist-dropout": ("Fashion-MNIST dropout zoo (fixtures/fmnist-dropout-zoo: 10 recipes, each without "
                           "and with Dropout before the head)",
                           lambda: read_zoo_file(ROOT / "fixtures" / "fmnist-dropout-zoo" / "zoo.csv",
                                                 name="fmnist-dropout", default_quality="test_accuracy",
                                                 lower_is_better=("test_loss",)), fmnist_module),
        "cifar10-resnet": ("CIFAR-10 ResNet-20/32/44/56 (akamaster, published accuracy)",
                           lambda: load_zoo("cifar10-resnet"), cifar_module),
    }


# --- scoring -------------------------------------------------------------------------------------


def module_scorer(build: Builder) -> Callable[[str, Any], dict[str, Any]]:
    """A :func:`wbfe.rank` scorer that scores the rebuilt module of each file instead of the file."""
    def scorer(ref: str, options: Any) -> dict[str, Any]:
        import wbfe

        plain = wbfe.score(build(ref), options=options).to_dict()
        return {"summary": plain["summary"], "model": plain["model"],
                "n_layers": len(plain["layers"]), "n_skipped": len(plain["skipped"])}
    return scorer


def correlation(values: list[float], quality: list[float]) -> dict[str, Any]:
    """ρ, its interval and n of one metric on some models (:func:`wbfe.ranking.correlate`, default settings)."""
    from wbfe.ranking import correlate

    c = correlate(values, quality)
    out: dict[str, Any] = {"n": c.n, "rho": c.rho, "ci_low": c.ci_low, "ci_high": c.ci_high, "p_value": c.p_value}
    if c.reason:
        out["reason"] = c.reason
    return out


def split(models: Sequence[Mapping[str, Any]], metrics: list[str]) -> dict[str, dict[str, Any]]:
    """Every metric's correlation on all ``models`` and on those of each status (models: score dicts)."""
    out: dict[str, dict[str, Any]] = {}
    for metric in metrics:
        row: dict[str, Any] = {}
        for status in ("all",) + STATUSES:
            chosen = [m for m in models if status == "all" or m["status"] == status]
            if chosen:
                row[status] = correlation([_num(m["scores"].get(metric)) for m in chosen],
                                          [m["quality"] for m in chosen])
        out[metric] = row
    return out


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def rank_view(zoo: Any, scorer: Optional[Callable[[str, Any], Any]]) -> dict[str, Any]:
    """One zoo ranked by :func:`wbfe.rank` (no cache: the numbers come from this run)."""
    import wbfe

    kwargs: dict[str, Any] = {"scorer": scorer} if scorer is not None else {}
    result = wbfe.rank(zoo, "test_accuracy", cache_dir=False, metrics=METRICS, **kwargs)
    models = [{"model": m.model, "quality": m.quality, "status": m.applicability, "scores": m.scores}
              for m in result.models]
    metrics = [row.metric for row in result.metrics]
    table = split(models, metrics)
    for row in result.metrics:  # rank's own figures and these are the same computation: say so if not
        mine = table[row.metric]
        assert math.isclose(mine["all"]["rho"], row.rho, abs_tol=1e-12) or not math.isfinite(row.rho), row.metric
        if row.applicable and "holds" in mine:
            assert mine["holds"]["n"] == row.applicable["n"], row.metric
    return {"counts": result.applicability, "failed": [[f.model, f.reason] for f in result.failed],
            "models": models, "metrics": table, "metric_order": sorted(metrics, key=_metric_key)}


def _metric_key(metric: str) -> tuple[int, str, str]:
    """BFE-W first, then the others alphabetically; ``_head`` before ``_mean``."""
    base, _, kind = metric.rpartition("_")
    return (0 if base == "bfe" else 1, base, kind)


def largest_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> float:
    """The largest |difference| between two views' scores of the same models and metrics."""
    by_name = {m["model"]: m["scores"] for m in b}
    diffs = [abs(_num(v) - _num(by_name[m["model"]].get(k))) for m in a for k, v in m["scores"].items()
             if v is not None and by_name[m["model"]].get(k) is not None]
    return max(diffs, default=0.0)


def left_out() -> dict[str, str]:
    """The zoos rank knows that this run cannot score, with why: every built-in zoo whose
    checkpoints are downloaded (this script runs offline), and ``timm:`` / ``torchvision:``
    references, which name downloadable weights."""
    from wbfe.ranking.zoo import list_zoos

    out = {zoo.name: f"{zoo.description}: its weights are downloaded, and this run is offline"
           for zoo in list_zoos() if not zoo.offline}
    out["timm: / torchvision: / hf: references"] = ("a zoo spec may name timm, torchvision or Hub models "
                                                    "(wbfe/ranking/zoo.py); their weights are downloaded, and "
                                                    "this run is offline")
    return out


def measure() -> dict[str, Any]:
    """Score every zoo in both views; return what the JSON holds."""
    import platform

    import wbfe
    from wbfe.errors import SourceNotFoundError

    started = time.perf_counter()
    out: dict[str, Any] = {"zoos": {}, "missing": {}, "left_out": left_out()}
    pooled: list[dict[str, Any]] = []
    for key, (title, load, build) in zoos().items():
        try:
            zoo = load()
        except SourceNotFoundError as exc:
            out["missing"][key] = str(exc)
            continue
        file_view = rank_view(zoo, None)
        module_view = rank_view(zoo, module_scorer(build))
        out["zoos"][key] = {"title": title, "quality": "test_accuracy", "n_models": len(module_view["models"]),
                            "views": {"file": file_view, "module": module_view},
                            "max_score_difference": largest_difference(file_view["models"], module_view["models"])}
        print(f"{key}: file {file_view['counts']}  module {module_view['counts']}", file=sys.stderr)
        if key.startswith("fmnist"):
            pooled += [{**m, "model": f"{key}/{m['model']}"} for m in module_view["models"]]
    if pooled:
        metrics = out["zoos"]["fmnist"]["views"]["module"]["metric_order"]
        counts = {s: sum(1 for m in pooled if m["status"] == s) for s in STATUSES}
        out["zoos"]["fmnist-all"] = {
            "title": "both Fashion-MNIST zoos together (the same task and test set; module view)",
            "quality": "test_accuracy", "n_models": len(pooled),
            "views": {"module": {"counts": counts, "failed": [], "models": pooled,
                                 "metrics": split(pooled, metrics), "metric_order": metrics}}}
    out["run"] = {"seconds": round(time.perf_counter() - started, 1), "wbfe": wbfe.__version__,
                  "python": platform.python_version(), "command": COMMAND,
                  "stats": "wbfe.ranking.correlate defaults: 2000 bootstrap resamples, 95 % percentile "
                           "interval, seed 0"}
    return out


# --- the page ------------------------------------------------------------------------------------


def _rho(c: Optional[Mapping[str, Any]]) -> str:
    if not c:
        return "—"
    if c.get("rho") is None or not math.isfinite(c["rho"]):
        return f"n/a ({c.get('n', 0)})"
    low, high = c.get("ci_low"), c.get("ci_high")
    ci = f" [{low:+.2f}, {high:+.2f}]" if low is not None and high is not None else ""
    return f"{c['rho']:+.2f}{ci}"


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{s} {counts[s]}" for s in STATUSES if counts.get(s))


def _table(view: Mapping[str, Any]) -> list[str]:
    counts = view["counts"]
    shown = ["all"] + [s for s in STATUSES if counts.get(s)]
    head = "| metric | " + " | ".join(f"{s} (n = {sum(counts.values()) if s == 'all' else counts[s]})"
                                       for s in shown) + " |"
    lines = [head, "|---" * (len(shown) + 1) + "|"]
    for metric in view["metric_order"]:
        row = view["metrics"][metric]
        lines.append(f"| `{metric}` | " + " | ".join(_rho(row.get(s)) for s in shown) + " |")
    return lines


def _cell(data: Mapping[str, Any], zoo: str, status: str, metric: str = "bfe_head") -> str:
    view = data["zoos"].get(zoo, {}).get("views", {}).get("module")
    return _rho(view["metrics"].get(metric, {}).get(status)) if view else "—"


def render(results: Path = RESULTS) -> str:
    """docs/evidence.md from the JSON the scoring run wrote."""
    data = json.loads(Path(results).read_text(encoding="utf-8"))
    run = data["run"]
    out = [
        "# Evidence: BFE-W and the other metrics on the project's own zoos, by applicability",
        "",
        f"<!-- Generated by `{run['command']}` from benchmarks/results/evidence.json; do not edit by hand. -->",
        "",
        f"*This page is generated: `{run['command']}` scores every zoo and rewrites it "
        f"(`{run['command']} --render` rewrites it from `benchmarks/results/evidence.json` alone); "
        "`tests/test_docs.py` fails while the two disagree.*",
        "",
        "Each metric's Spearman ρ against measured test accuracy (the quality, higher is better), with its "
        "95 % bootstrap interval, on every zoo the project ships or trains: on all models, and on the "
        "models of each BFE-W applicability status (`summary.bfe_applicability`, [metrics.md]"
        "(metrics.md#where-bfe-w-applies)). For BFE-W, `alpha`, `alpha_weighted`, `log_norm`, "
        "`log_spectral_norm` and `log_alpha_norm` a *negative* ρ is agreement (lower predicts better); "
        "`stable_rank` and `entropy` have no expected sign. The metric groups are rank's defaults (bfe, htsr) "
        "and the HTMP fit (`h`, `f_inf`, `htmp_kappa`, [metrics.md](metrics.md)), which have no expected sign "
        "here either. Statistics: "
        f"{run['stats']}; with wbfe {run['wbfe']}, in {run['seconds']} s.",
        "",
        "## How the statuses are obtained",
        "",
        "The zoos are bare safetensors files: scored as files, every model is `unknown` (a state dict "
        "describes no model). Their architectures are known, so each zoo is also scored as its rebuilt "
        "`nn.Module` with the file's weights loaded (`strict=True`), and the status comes from the module "
        "graph by the same rules as for any model (dropout before the head, vision transformer, one linear "
        "head): the Fashion-MNIST networks from their header metadata (`benchmarks/fashion_mnist/models.py`), "
        "the CIFAR ResNets from akamaster's definition (`benchmarks/cifar_resnet/models.py`). The scores of "
        "both views are the same numbers; the largest difference found:",
        "",
        "| zoo | models | as files | as modules | largest score difference |",
        "|---|---|---|---|---|",
    ]
    for key, zoo in data["zoos"].items():
        views = zoo["views"]
        files = _counts(views["file"]["counts"]) if "file" in views else "(pooled)"
        diff = f"{zoo['max_score_difference']:.1e}" if "max_score_difference" in zoo else "—"
        out.append(f"| `{key}` | {zoo['n_models']} | {files} | {_counts(views['module']['counts'])} | {diff} |")
    for key, why in data.get("missing", {}).items():
        out.append(f"| `{key}` | — | not scored: {why} | | |")
    if data.get("left_out"):
        out += ["", "Left out: the zoos `wbfe rank` knows whose models this run cannot score (no network "
                "here), so no ρ on this page covers them:", "",
                "| zoo | why |", "|---|---|",
                *[f"| `{key}` | {why} |" for key, why in data["left_out"].items()]]
    out += [
        "",
        "## The paper's figures, for context",
        "",
        "Spearman ρ of BFE-W with accuracy reported by the BFE-W paper (arXiv 2610.13123), and the status "
        "wbfe's rules give such models:",
        "",
        "| models | status | ρ (paper) |",
        "|---|---|---|",
        *[f"| {what} | `{status}` | {rho} |" for what, status, rho in PAPER],
        "",
        "## Where the conditions hold: the paper beside this project",
        "",
        "A `holds` verdict says a model is in the setting BFE-W is derived for; it is no prediction of ρ. "
        "BFE-W at the head (`bfe_head`) on the models whose status is `holds`, as the paper reports it and as "
        "this project measures it (module view, ρ [95 % interval]):",
        "",
        "| models | source | ρ of `bfe_head` |",
        "|---|---|---|",
        *[f"| {what} | the paper | {rho} |" for what, status, rho in PAPER if status == "holds"],
        *[f"| `{key}`: {zoo['title']} | measured here | {_cell(data, key, 'holds')} |"
          for key, zoo in data["zoos"].items() if zoo["views"]["module"]["counts"].get("holds")],
        "",
        "## Measured",
        "",
        "ρ [95 % interval] per status (module view; the `all` column is also the file view's ρ, where "
        "every model is `unknown`). `n/a (k)`: no ρ on k models (fewer than 3, or a constant side).",
    ]
    for key, zoo in data["zoos"].items():
        out += ["", f"### `{key}`: {zoo['title']}", "", *_table(zoo["views"]["module"])]
    out += ["", "## Reading", "", *_reading(data), ""]
    return "\n".join(out)


def _stat(data: Mapping[str, Any], zoo: str, status: str, metric: str = "bfe_head") -> Optional[Mapping[str, Any]]:
    view = data["zoos"].get(zoo, {}).get("views", {}).get("module")
    return view["metrics"].get(metric, {}).get(status) if view else None


def _sign(c: Optional[Mapping[str, Any]], expected: int = -1) -> str:
    """What an interval says about the sign of ρ, against the expected one."""
    if not c or c.get("rho") is None:
        return "no ρ"
    if c["ci_low"] is None or c["ci_high"] is None or c["ci_low"] <= 0 <= c["ci_high"]:
        return "an interval that includes 0 (no sign established)"
    agrees = (c["ci_high"] < 0) == (expected < 0)
    return ("an interval on the expected side of 0 (lower predicts better, as in the paper)" if agrees
            else "an interval on the wrong side of 0 (higher BFE-W goes with higher accuracy, against the paper)")


def _overlap(a: Optional[Mapping[str, Any]], b: Optional[Mapping[str, Any]]) -> Optional[bool]:
    if not a or not b or None in (a.get("ci_low"), a.get("ci_high"), b.get("ci_low"), b.get("ci_high")):
        return None
    return max(a["ci_low"], b["ci_low"]) <= min(a["ci_high"], b["ci_high"])


def _by_direction(data: Mapping[str, Any], zoo: str, status: str) -> tuple[list[str], list[str]]:
    """The metrics with an expected sign whose interval excludes 0 on its side, and on the other side."""
    from wbfe.ranking import expected_sign

    view = data["zoos"].get(zoo, {}).get("views", {}).get("module")
    right: list[str] = []
    wrong: list[str] = []
    for metric in view["metric_order"] if view else []:
        c, sign = view["metrics"][metric].get(status), expected_sign(metric)
        if not c or sign is None or c.get("ci_low") is None or c["ci_low"] <= 0 <= c["ci_high"]:
            continue
        (right if (c["ci_high"] < 0) == (sign < 0) else wrong).append(f"`{metric}` ({c['rho']:+.2f})")
    return right, wrong


def _reading(data: Mapping[str, Any]) -> list[str]:
    """The plain-words reading; every figure and every sign or overlap it states is read from the JSON."""
    def c(zoo: str, status: str, metric: str = "bfe_head") -> str:
        return _cell(data, zoo, status, metric)

    out = []
    if "fmnist" in data["zoos"]:
        sign = _sign(_stat(data, "fmnist", "holds"))
        why = ("" if "wrong side" not in sign else
               " The zoo differs from the paper's setting in ways the rules do not read: most of its models "
               "are trained for 10 epochs or fewer (zoo.csv), so probably short of interpolation, which BFE-W's "
               "derivation assumes, and it mixes two families (MLP, CNN) and head widths; which of these, if any, "
               "gives the positive ρ this page does not establish.")
        out.append(f"- **Fashion-MNIST zoo, every model `holds`** (MLPs and CNNs, one linear head, no dropout): "
                   f"BFE-W at the head has ρ {c('fmnist', 'holds')}, {sign}; the paper reports −0.71 to −1.00 on "
                   f"standard conv nets.{why}")
    if "cifar10-resnet" in data["zoos"]:
        r = _stat(data, "cifar10-resnet", "holds")
        p = f", exact permutation p = {r['p_value']:.3f}" if r and r.get("p_value") is not None else ""
        out.append(f"- **CIFAR ResNets, `holds`**: BFE-W at the head has ρ {c('cifar10-resnet', 'holds')}{p}. "
                   "With four models the bootstrap interval says little (a perfectly ordered set stays perfectly "
                   "ordered in every resample, so the interval collapses onto ρ); the permutation p-value is the "
                   "honest measure of how much four models can show.")
    if "fmnist-dropout" in data["zoos"]:
        holds, fails = _stat(data, "fmnist-dropout", "holds"), _stat(data, "fmnist-dropout", "fails")
        overlap = _overlap(holds, fails)
        verdict = ("the two intervals overlap, so this zoo does not separate the statuses" if overlap
                   else "the two intervals do not overlap" if overlap is not None else "no comparison")
        out.append(f"- **Dropout zoo, the status really differs**: BFE-W at the head has ρ {c('fmnist-dropout', 'holds')} "
                   f"on the ten models without dropout (`holds`) and {c('fmnist-dropout', 'fails')} on their ten "
                   f"twins with dropout before the head (`fails`; paper: 0.00 on VGG, EfficientNet, MNASNet): "
                   f"{verdict}. Each pair shares seed, data and schedule, so the two halves span similar accuracies.")
    if "fmnist-all" in data["zoos"]:
        right, wrong = _by_direction(data, "fmnist-all", "holds")
        out.append(f"- **Both Fashion-MNIST zoos, `holds` models** (n = {(_stat(data, 'fmnist-all', 'holds') or {}).get('n')}): "
                   f"metrics whose interval excludes 0 on their expected side: {', '.join(right) or 'none'}; on the "
                   f"other side (higher value, higher accuracy, against the sign wbfe expects for them): "
                   f"{', '.join(wrong) or 'none'}." if wrong else
                   f"metrics whose interval excludes 0 on their expected side: {', '.join(right) or 'none'}.")
    out.append("- **How much these say.** Ten models give a 95 % interval about a unit wide: a difference between "
               "the `holds` and `fails` columns is a measurement only where the intervals do not overlap. The "
               "statuses come from the architecture alone (wbfe/framework/applicability.py), never from these numbers, and "
               "nothing here is tuned to them; where the measured ρ disagrees with the paper, this page reports it "
               "as measured.")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    """Score (or only render, or check) and write; return an exit code."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--render", action="store_true", help="rewrite the page from the JSON only")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else ""
        if current != render(args.results):
            print(f"{args.output} is out of date: run {COMMAND} --render", file=sys.stderr)
            return 1
        return 0
    if not args.render:
        if str(ROOT) not in sys.path:  # run as a plain script from anywhere
            sys.path.insert(0, str(ROOT))
        import torch

        torch.set_num_threads(1)
        args.results.write_text(json.dumps(finite(measure()), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    args.output.write_text(render(args.results), encoding="utf-8")
    return 0


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (standard JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


if __name__ == "__main__":
    raise SystemExit(main())
