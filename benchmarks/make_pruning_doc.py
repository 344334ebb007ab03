"""Write docs/pruning.md from benchmarks/results/pruning.json (written by benchmarks/bench_pruning.py).

Every measured figure on the page, and every sentence that states a gain or its absence, is computed
here from the JSON; the prose around them is the template below. Rerun after the benchmark writes new
results and commit both: ``tests/test_pruning.py`` fails while the page and the file disagree.

    python benchmarks/make_pruning_doc.py            # rewrite docs/pruning.md
    python benchmarks/make_pruning_doc.py --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "pruning.json"
OUTPUT = ROOT / "docs" / "pruning.md"
ZOO_LABELS = {"fmnist-zoo": "fixtures/fmnist-zoo", "fmnist-dropout-zoo": "fixtures/fmnist-dropout-zoo",
              "fmnist-cnn": "fixtures/fmnist-cnn (the default fixture)", "all": "all zoos together"}


def _pct(t: Any) -> str:
    return f"{float(t) * 100:.0f} %"


def _cell(entry: dict[str, Any], uniform: bool) -> str:
    acc = f"{entry['mean']:.1f} ± {entry['std']:.1f}"
    if uniform:
        return acc
    return (f"{acc} ({entry['gain_mean']:+.1f} ± {entry['gain_std']:.1f}; "
            f"{entry['wins']}–{entry['ties']}–{entry['losses']})")


def _table(block: dict[str, Any], targets: list[float], variants: list[str]) -> str:
    head = "| allocation | " + " | ".join(_pct(t) for t in targets) + " |"
    lines = [head, "|---|" + "---:|" * len(targets)]
    for v in variants:
        lines.append(f"| `{v}` | " + " | ".join(_cell(block[str(t)][v], v == "uniform") for t in targets) + " |")
    return "\n".join(lines)


def _unpruned(models: list[dict[str, Any]], zoo: str) -> tuple[float, int, int]:
    chosen = [m for m in models if zoo == "all" or m["zoo"] == zoo]
    return (sum(m["accuracy"] for m in chosen) / len(chosen), len(chosen),
            sum(1 for m in chosen if m["prunable"] > 1))


def _findings(data: dict[str, Any]) -> str:
    """The sentences that say how large the gain is and where there is none, from the summary."""
    targets, summary, best = data["targets"], data["summary"], data["best"]
    metrics = [v for v in data["variants"] if v != "uniform" and not v.endswith("-reversed")]
    multi = summary["all"]["multi"]
    by = best["by"]
    out = [f"- **The default `--by {by}`** has the largest mean gain over uniform pruning, averaged over the "
           f"three targets, on the {multi['n']} models with two or more prunable matrices: "
           + ", ".join(f"{_pct(t)}: {multi[str(t)][by]['gain_mean']:+.1f} points "
                       f"({multi[str(t)][by]['wins']} better, {multi[str(t)][by]['ties']} equal, "
                       f"{multi[str(t)][by]['losses']} worse)" for t in targets) + "."]
    ranked = sorted(metrics, key=lambda m: -best["mean_gain_over_targets"][m])
    out.append("- Mean gain over the three targets, by metric: "
               + ", ".join(f"`{m}` {best['mean_gain_over_targets'][m]:+.1f}" for m in ranked) + " points.")
    overall = {v: sum(multi[str(t)][v]["gain_mean"] for t in targets) / len(targets)
               for v in data["variants"] if v != "uniform"}
    top = max(overall, key=lambda v: overall[v])
    if top != by:
        losses = sum(multi[str(t)][top]["losses"] for t in targets)
        own = sum(multi[str(t)][by]["losses"] for t in targets)
        out.append(f"- Of every variant measured, including `--reverse`, `{top}` had the largest mean gain "
                   f"({overall[top]:+.1f} points; {losses} losses to uniform over the three targets, against "
                   f"{own} for `{by}`). The default stays a metric in the direction this page argues for; "
                   f"`--by {top.removesuffix('-reversed')}{' --reverse' if top.endswith('-reversed') else ''}` "
                   "gives that allocation.")
    none = [(m, t) for m in metrics for t in targets if multi[str(t)][m]["gain_mean"] <= 0]
    if none:
        out.append("- **No gain** (mean gain ≤ 0 on those models): "
                   + ", ".join(f"`{m}` at {_pct(t)}" for m, t in none) + ".")
    single = summary["all"]["all"]["n"] - multi["n"]
    out.append(f"- **No gain possible** on the {single} models with one prunable matrix (an MLP with one hidden "
               "layer: its only matrix besides the excluded head must carry the whole target), where every "
               "allocation is uniform.")
    flipped = [m for m in metrics
               if sum(multi[str(t)][f"{m}-reversed"]["gain_mean"] for t in targets)
               > sum(multi[str(t)][m]["gain_mean"] for t in targets)]
    if flipped:
        out.append("- Reversed (`--reverse`) did better on average than wbfe's direction for "
                   + ", ".join(f"`{m}`" for m in flipped) + ": on these small networks the direction that wins is "
                   "largely the one that prunes the small matrices less (see below).")
    for zoo in (z for z in summary if z != "all"):
        block = summary[zoo].get("multi")
        if block is None:
            continue
        losing = [t for t in targets if block[str(t)][by]["gain_mean"] <= 0]
        if losing:
            out.append(f"- In {ZOO_LABELS.get(zoo, zoo)}, `{by}` gains nothing at "
                       + ", ".join(_pct(t) for t in losing) + ".")
    return "\n".join(out)


def render(results: Path = RESULTS) -> str:
    data = json.loads(Path(results).read_text(encoding="utf-8"))
    targets, variants, summary = data["targets"], data["variants"], data["summary"]
    check = data["end_to_end"]
    sections = []
    for zoo in ["all"] + [z for z in summary if z != "all"]:
        for subset in ("multi", "all") if zoo == "all" else ("multi",):
            block = summary[zoo].get(subset)
            if block is None:
                continue
            acc, n, n_multi = _unpruned(data["models"], zoo)
            which = (f"the {block['n']} models with two or more prunable matrices" if subset == "multi"
                     else f"all {n} models ({n_multi} with two or more prunable matrices)")
            sections.append(f"#### {ZOO_LABELS.get(zoo, zoo)}: {which}\n\nUnpruned: {acc:.1f} % mean test accuracy "
                            f"over the zoo's {n} models.\n\n" + _table(block, targets, variants))
    return TEMPLATE.format(
        targets=", ".join(_pct(t) for t in targets), best=data["best"]["by"], findings=_findings(data),
        tables="\n\n".join(sections), seconds=data["seconds"], versions=", ".join(
            f"{k} {v}" for k, v in data["versions"].items()),
        e2e=f"`wbfe.prune` of the default fixture at {_pct(check['target'])} by `{check['by']}` wrote a file whose "
            f"test accuracy, {check['accuracy']:.2f} %, is the in-memory result's ({check['in_memory_accuracy']:.2f} %)",
        what=data["what"])


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render(args.results)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else ""
        return 0 if current == text else 1
    args.output.write_text(text, encoding="utf-8")
    return 0


TEMPLATE = """\
# Layer-wise pruning from the spectra: `wbfe sparsity` and `wbfe prune`

<!-- Generated by benchmarks/make_pruning_doc.py from benchmarks/results/pruning.json; edit the template there. -->

AlphaPruning (Lu et al., NeurIPS 2024) allocates sparsity per layer from a heavy-tail metric: a
layer with a smaller power-law exponent α, better trained, is pruned less. wbfe computes that
metric, and the others its allocation can follow, per matrix and on every format it reads:

- `wbfe sparsity REF --target 0.7` prints the per-matrix sparsity that reaches the target overall
  (and writes it as JSON and CSV): what you hand to Wanda, SparseGPT or your own pruner;
- `wbfe prune REF OUT.safetensors --target 0.7` writes a magnitude-pruned safetensors copy at that
  allocation (OUT named `*.safetensors`, else refused before any work, as for `wbfe smooth`) and reports,
  per matrix, the sparsity reached and the change in its metrics.

Below: how the allocation is made, the options, the library calls, and what it was measured to
gain over uniform pruning (test accuracy without fine-tuning at {targets} sparsity).

## The allocation

1. **The matrices.** The rows of `wbfe score`: 2-D weights and 4-D convolutions stored as float64,
   float32, float16 or bfloat16 (the others are listed as excluded, with the reason), selected by
   `--layers` as in `score`. The head and the embeddings are left out by default (the rows' `role`;
   `--exclude` names other roles, `--exclude ''` prunes every matrix). A convolution counts its
   whole kernel (out·in·kh·kw weights). The target is the sparsity of these matrices together,
   weighted by their weights; biases, norms and excluded matrices stay as they are and are not
   counted. What the score skipped (biases, all-zero matrices, ...) is listed under `skipped` in the
   JSON, with the reason.
2. **The map.** Each matrix's value of the `--by` column (`alpha`, `bfe`, `h`, `stable_rank`) —
   or its rank among them with `--mapping rank` — is mapped linearly onto [target − ε, target + ε]
   (ε = `--spread`), the largest value to target + ε. A larger value is pruned more for every
   column (`--reverse` flips it): a smaller α is the better-trained layer (AlphaPruning), a lower
   `bfe` predicts the better model (its expected sign, [metrics.md](metrics.md)), `h` above h\\* is
   the under-fit side, and training concentrates a spectrum, which lowers `stable_rank`.
3. **The rescale.** As in AlphaPruning the mapped values are multiplied by the one factor (found
   by bisection) for which the parameter-weighted mean is the target, each clipped to
   [0, 1 − 1/n_min] (n_min: the smallest matrix's weights, so that every matrix keeps a weight; one
   bound for all, so the allocation stays monotone in the metric). A target at or above that
   bound is refused.
4. **Missing values.** A matrix whose value is NaN or infinite (too few eigenvalues for a tail fit,
   a rank-deficient matrix's BFE-W) gets the median of the others' values; its row's `note` says so.
   A column that is NaN on every matrix, or absent from a score passed in, is refused.
5. **Counts.** A matrix of n weights and sparsity s loses k = round(s·n) weights, so the overall
   count is within one weight per matrix of target·Σn. `--by uniform` gives every matrix the target.

## Commands

    wbfe sparsity REF --target 0.7 [--by {best}] [--spread 0.2] [--json alloc.json] [--csv alloc.csv]
    wbfe prune REF OUT --target 0.7 [--by {best}] [--method magnitude] [--json report.json]

| option | meaning |
|---|---|
| `--target` | overall sparsity of the pruned matrices, in (0, 1); required |
| `--by` | `alpha`, `bfe`, `h` (runs the HTMP fit), `stable_rank` or `uniform`; default `{best}`, the best measured below |
| `--spread` | ε, half-width of the range the metric is mapped to, in [0, 1]; default `0.2` |
| `--mapping` | `value` (linear in the value, AlphaPruning) or `rank`; default `value` |
| `--reverse` | prune the matrices with the smaller value more |
| `--exclude` | roles left unpruned; default `head,embedding` |
| `--layers`, `--head` | as for `wbfe score` |
| `--method` | (`prune`) `magnitude`: each matrix's k smallest \\|w\\| set to zero, unstructured; ties broken by position (a stable sort in storage order); default `magnitude` |
| `--json`, `--csv` | also write the allocation (`sparsity`) or the per-matrix report (`prune`) to a file |

A bad value — a target ≤ 0 or ≥ 1, an unknown `--by`, a column not computed — is one
`wbfe: error:` line and exit code 2, before anything is read where the value alone decides.

## The pruned file

`wbfe prune` streams the checkpoint one tensor at a time through the writer of `wbfe smooth`
([editing.md](editing.md)): each allocated matrix pruned in its own dtype, every other tensor copied
byte for byte, the input's safetensors metadata kept (so facts about the unpruned model, such as a
recorded test accuracy, are carried over unchanged) and the allocation added under the key
`wbfe_pruning` (JSON: target, metric, spread, mapping, per-matrix sparsity and zero count). A tied weight
(one storage under two names, or two equal copies: the score reads the first) is written pruned under both
names, so the tie survives; a `--layers` that selects the second name alone is refused. The file
is written to a temporary file and renamed into place, and an output that is the input (or a link
to it), or lies in a folder it reads, is refused. What the edit would refuse (a quantised weight, a stray
second copy of a sharded tensor, a PEFT LoRA adapter, [editing.md](editing.md)) is refused before the score. The pruned file is scored
again: the report gives per matrix `reached`
(zero weights after pruning, zeros already there included), `dead_rows` and `dead_cols` (rows and
columns of the out × rest matrix left with no weight; the score leaves them out and computes BFE-W
and every spectrum column of the live part, [metrics.md](metrics.md), so the pruned file scores with
finite BFE-W — scattered exact zeros alone leave a full-rank matrix full rank), and `bfe`, `alpha`,
`stable_rank` (and `h` with `--by h`) before and after.

## Library

```python
import wbfe

allocation = wbfe.sparsity("model.safetensors", 0.7, by="{best}")   # or a ModelScore already computed
allocation.to_pandas()            # name, role, shape, params, metric, sparsity, zeros, note
ratios = allocation.as_dict()     # {{tensor name: sparsity}}
report = wbfe.prune("model.safetensors", "pruned.safetensors", target=0.7, by="{best}")
report.to_pandas()                # name, params, sparsity, zeros, reached, dead_rows/_cols, <metric>_before/_after
```

Both validate their options once (`wbfe.options.PruneOptions`) and raise a `WbfeError` subclass:
`InvalidOptionError` for a bad option, `wbfe.pruning.MetricNotComputedError` (a subclass of it) for a
column that is missing or NaN everywhere, `OverwriteError` (an `OutputError`) for an output over the input,
`UnsupportedDtypeError` for a quantised checkpoint `prune` cannot copy exactly.

### Handing the allocation to another pruner

The allocation is a ratio per tensor name. With PyTorch's own pruning utilities:

```python
import torch.nn.utils.prune as tp

for name, ratio in allocation.as_dict().items():
    module = model.get_submodule(name.rsplit(".", 1)[0])
    tp.l1_unstructured(module, "weight", amount=ratio)
```

Wanda and SparseGPT prune each layer to one ratio (`args.sparsity_ratio`); call their per-layer
step with `ratios[f"{{layer_name}}.weight"]` instead (the names are the checkpoint's, as
`allocation.to_pandas()` lists them).

## Measured: accuracy after pruning, without fine-tuning

{what}. Every model of the project's zoos with offline test data: the Fashion-MNIST MLPs and CNNs of
fixtures/fmnist-zoo and fixtures/fmnist-dropout-zoo and the default fixture, each evaluated on the
10,000 test images, pruned in memory with the library's allocation and magnitude pruning;
{e2e}. Each cell: mean ± standard deviation of the test accuracy (%) over the models, then, against
uniform pruning of the same model, the mean ± standard deviation of the gain in points and how
many models were better–equal–worse. `-reversed` is the same metric with `--reverse`.

{findings}

What the tables show on these networks: their prunable matrices are few and of very unequal sizes
(a first convolution, or a second hidden layer, far smaller than the matrix that reads the input),
so the one large matrix is held near the target and the rescale drives the small ones to whichever
end of the range their metric puts them. Where that end is high (up to 1 − 1/n_min), the small
matrix is nearly emptied and the accuracy collapses to chance; where it is low, the small matrices
are spared and the model keeps more of its accuracy than under uniform pruning. So the metric that
wins here is the one that most often ranks the small matrices low — `stable_rank` cannot exceed a
matrix's smaller side, so it does that by construction — and a large standard deviation in a cell
is this all-or-nothing effect. AlphaPruning's own setting, many transformer blocks of equal size,
is not what these zoos test; there the metric decides between equals.

{tables}

Reproduce: `python benchmarks/bench_pruning.py` (needs the Debian package `dataset-fashion-mnist`;
{seconds} s on the shared 2-core build machine; {versions}), then
`python benchmarks/make_pruning_doc.py`.
"""


if __name__ == "__main__":
    sys.exit(main())
