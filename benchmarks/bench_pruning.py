"""Test accuracy after magnitude pruning without fine-tuning: uniform against each allocation of ``wbfe sparsity``.

Every model of the project's zoos with offline test data (fixtures/fmnist-zoo, fixtures/fmnist-dropout-zoo
and the default fixture fixtures/fmnist-cnn, all Fashion-MNIST, evaluated on the 10,000 test images
of the Debian package ``dataset-fashion-mnist``) is scored once (``bfe,htsr,htmp``), then for each
overall sparsity (50, 70, 90 %) and each allocation (``uniform``; ``alpha``, ``bfe``, ``h``,
``stable_rank`` in wbfe's direction and reversed) pruned in memory with the library's own
:func:`wbfe.pruning.allocate` (through :func:`wbfe.pruning.sparsity` on the score) and
:func:`wbfe.pruning.magnitude_prune`, and its test accuracy measured. The head is left out (the
default), so a model with one hidden matrix gets the same allocation from every metric; those are
counted apart (``multi``: models with at least two prunable matrices). One end-to-end ``wbfe.prune``
of the default fixture checks that the file it writes gives the in-memory accuracy.

    python benchmarks/bench_pruning.py [--limit N]   # → benchmarks/results/pruning.json
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RESULTS = REPO / "benchmarks" / "results" / "pruning.json"
TARGETS = (0.5, 0.7, 0.9)
METRICS = ("alpha", "bfe", "h", "stable_rank")
ZOOS = {"fmnist-zoo": REPO / "fixtures" / "fmnist-zoo", "fmnist-dropout-zoo": REPO / "fixtures" / "fmnist-dropout-zoo",
        "fmnist-cnn": REPO / "fixtures" / "fmnist-cnn"}


def models(limit: int | None) -> list[tuple[str, Path]]:
    out = []
    for zoo, folder in ZOOS.items():
        if (folder / "zoo.csv").is_file():
            with (folder / "zoo.csv").open(newline="") as fh:
                names = [row["model"] for row in csv.DictReader(fh)]
        else:
            names = ["model.safetensors"]
        out += [(zoo, folder / n) for n in names[:limit]]
    return out


def variants() -> list[tuple[str, str, bool]]:
    return [("uniform", "uniform", False)] + [(m, m, False) for m in METRICS] + [(f"{m}-reversed", m, True)
                                                                                  for m in METRICS]


def evaluate(model: Any, state: dict[str, Any], x: Any, y: Any) -> float:
    from benchmarks.fashion_mnist.train import evaluate as fm_evaluate

    model.load_state_dict(state, strict=True)
    return fm_evaluate(model, x, y)[0]


def run_model(path: Path, data: Any) -> dict[str, Any]:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    import wbfe
    from benchmarks.fashion_mnist.models import ArchSpec, build_model
    from wbfe.pruning import magnitude_prune, sparsity

    with safe_open(str(path), framework="pt") as fh:
        meta = dict(fh.metadata())
    model = build_model(ArchSpec.from_metadata(meta))
    original = load_file(str(path))
    scored = wbfe.score(path, metrics="bfe,htsr,htmp")
    result: dict[str, Any] = {"model": path.name, "accuracy": evaluate(model, original, data.test_x, data.test_y),
                              "pruned": {}}
    seen: dict[tuple[int, ...], float] = {}  # equal counts prune equally: one evaluation each
    for target in TARGETS:
        for label, by, reverse in variants():
            allocation = sparsity(scored, target, by=by, reverse=reverse)
            key = tuple(r["zeros"] for r in allocation.rows)
            if key not in seen:
                state = dict(original)
                for row in allocation.rows:
                    w = original[row["name"]]
                    state[row["name"]] = torch.from_numpy(magnitude_prune(w.double().numpy(),
                                                                          row["zeros"])).to(w.dtype)
                seen[key] = evaluate(model, state, data.test_x, data.test_y)
            result["pruned"].setdefault(label, {})[str(target)] = {
                "accuracy": seen[key], "overall": allocation.overall,
                "sparsity": {r["name"]: round(r["sparsity"], 6) for r in allocation.rows}}
    result["prunable"] = len(allocation.rows)
    return result


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per zoo (and over all), per target and allocation: mean and standard deviation of the accuracy
    and of its gain over uniform, and how often it beats / ties / loses to uniform."""
    out: dict[str, Any] = {}
    groups = {zoo: [r for r in rows if r["zoo"] == zoo] for zoo in ZOOS}
    groups["all"] = rows
    for zoo, members in groups.items():
        for subset, chosen in (("all", members), ("multi", [r for r in members if r["prunable"] > 1])):
            if not chosen:
                continue
            block: dict[str, Any] = {"n": len(chosen)}
            for target in TARGETS:
                t = str(target)
                uniform = np.array([r["pruned"]["uniform"][t]["accuracy"] for r in chosen])
                for label, _, _ in variants():
                    acc = np.array([r["pruned"][label][t]["accuracy"] for r in chosen])
                    gain = acc - uniform
                    block.setdefault(t, {})[label] = {
                        "mean": float(acc.mean()), "std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                        "gain_mean": float(gain.mean()), "gain_std": float(gain.std(ddof=1)) if len(gain) > 1 else 0.0,
                        "wins": int(np.sum(gain > 0)), "ties": int(np.sum(gain == 0)), "losses": int(np.sum(gain < 0))}
            out.setdefault(zoo, {})[subset] = block
    return out


def best_metric(summary: dict[str, Any]) -> dict[str, Any]:
    """The metric (wbfe's direction) with the largest mean gain over uniform, averaged over the three
    targets, on the models with more than one prunable matrix of all zoos together."""
    block = summary["all"]["multi"]
    means = {m: float(np.mean([block[str(t)][m]["gain_mean"] for t in TARGETS])) for m in METRICS}
    return {"by": max(means, key=lambda m: means[m]), "mean_gain_over_targets": means}


def end_to_end(data: Any) -> dict[str, Any]:
    """``wbfe.prune`` writes the default fixture pruned by its allocation; the file gives the in-memory accuracy."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    import wbfe
    from benchmarks.fashion_mnist.models import ArchSpec, build_model
    from wbfe.pruning import prune

    path = wbfe.default_checkpoint()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pruned.safetensors"
        report = prune(path, out, target=0.7, by="alpha")
        with safe_open(str(out), framework="pt") as fh:
            model = build_model(ArchSpec.from_metadata(dict(fh.metadata())))
        acc = evaluate(model, load_file(str(out)), data.test_x, data.test_y)
    return {"model": "fmnist-cnn", "target": 0.7, "by": "alpha", "accuracy": acc, "overall": report.overall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="models per zoo (a quick run; not for the results file)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    import torch

    from benchmarks.fashion_mnist.train import load_dataset

    torch.set_num_threads(1)
    data = load_dataset(test_only=True)
    start = time.time()
    rows = []
    for zoo, path in models(args.limit):
        row = run_model(path, data)
        row["zoo"] = zoo
        rows.append(row)
        print(f"{zoo}/{path.name}: {row['accuracy']:.2f} → " + ", ".join(
            f"{label} {row['pruned'][label]['0.7']['accuracy']:.1f}" for label, _, _ in variants()), flush=True)
    summary = summarise(rows)
    check = end_to_end(data)
    in_memory = next(r for r in rows if r["zoo"] == "fmnist-cnn")["pruned"]["alpha"]["0.7"]["accuracy"]
    check["in_memory_accuracy"] = in_memory
    import wbfe

    result = {
        "what": "Fashion-MNIST test accuracy (%) after magnitude pruning without fine-tuning, uniform against "
                "wbfe sparsity's allocations (spread 0.2, mapping value, head excluded)",
        "targets": list(TARGETS), "variants": [v[0] for v in variants()], "summary": summary,
        "best": best_metric(summary), "end_to_end": check, "models": rows,
        "seconds": round(time.time() - start, 1),
        "versions": {"wbfe": wbfe.__version__, "torch": torch.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}: best {result['best']}; end to end {check}")
    return 0 if abs(check["accuracy"] - in_memory) < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
