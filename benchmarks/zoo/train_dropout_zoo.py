"""Train the Fashion-MNIST dropout zoo in ``fixtures/fmnist-dropout-zoo``: models whose BFE-W
applicability really differs (docs/evidence.md).

Ten training recipes (an MLP or a small CNN, varying width, depth, epochs, learning rate, training-set
size and label noise, as in ``train_zoo.py``), each trained twice with the same seed: once as is, and
once with an ``nn.Dropout(p)`` (p 0.25 or 0.5) on the features the classifier reads. The dropout
twin is the setting the BFE-W paper finds its metric uninformative in; the rules of
:mod:`wbfe.framework.applicability` read it from the rebuilt module (``fails``: dropout before the head) and
the twin without it comes out ``holds``, from the architecture alone. Every model is trained with
one CPU thread and deterministic algorithms (``benchmarks/fashion_mnist/train.py``), saved as
``<name>.safetensors`` (float32; the architecture, dropout rate included, the settings and the
measured test accuracy in its header metadata) and listed in ``zoo.csv``. Run from the repository
root (a few minutes on one core):

    .venv/bin/python benchmarks/zoo/train_dropout_zoo.py

Needs the Debian package ``dataset-fashion-mnist``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.fashion_mnist.train import TrainConfig

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "benchmarks/zoo/train_dropout_zoo.py"
SOURCE = f"trained by {SCRIPT}"
COLUMNS = ("model", "test_accuracy", "test_loss", "arch", "width", "depth", "dropout", "epochs", "lr",
           "weight_decay", "label_noise", "train_size", "seed", "params", "optimizer",
           "batch_size", "schedule", "source")

# recipe: (arch, width, depth, epochs, optimizer, lr, label_noise, train_size, dropout of the twin)
# The recipe's seed is its position here; both twins of a recipe share it (same initialisation,
# same data order), so within a pair only the dropout differs. Batch 128, cosine schedule, no
# weight decay throughout.
RECIPES: dict[str, tuple[str, int, int, int, str, float, float, int, float]] = {
    "mlp-w32-d1-e3": ("mlp", 32, 1, 3, "adam", 1e-3, 0.0, 60000, 0.5),
    "mlp-w64-d1-e5": ("mlp", 64, 1, 5, "adam", 1e-3, 0.0, 60000, 0.25),
    "mlp-w128-d2-e5": ("mlp", 128, 2, 5, "adam", 1e-3, 0.0, 60000, 0.5),
    "mlp-w64-d2-e4-n10000": ("mlp", 64, 2, 4, "adam", 1e-3, 0.0, 10000, 0.25),
    "mlp-w64-d1-e20-n2000": ("mlp", 64, 1, 20, "adam", 1e-3, 0.0, 2000, 0.5),
    "mlp-w32-d2-e1-sgd-lr0.005": ("mlp", 32, 2, 1, "sgd", 5e-3, 0.0, 60000, 0.25),
    "mlp-w128-d1-e30-noise0.4-n5000": ("mlp", 128, 1, 30, "adam", 1e-3, 0.4, 5000, 0.5),
    "mlp-w64-d2-e40-noise0.6-n3000": ("mlp", 64, 2, 40, "adam", 1e-3, 0.6, 3000, 0.25),
    "cnn-w4-d1-e2": ("cnn", 4, 1, 2, "adam", 2e-3, 0.0, 60000, 0.5),
    "cnn-w8-d2-e2-n20000": ("cnn", 8, 2, 2, "adam", 2e-3, 0.0, 20000, 0.25),
}


def entries() -> dict[str, "TrainConfig"]:
    """Every model of the zoo by name: each recipe without dropout, then with its dropout."""
    from benchmarks.fashion_mnist.models import ArchSpec
    from benchmarks.fashion_mnist.train import TrainConfig

    out: dict[str, TrainConfig] = {}
    for seed, (recipe, (arch, width, depth, epochs, optimizer, lr, noise, size, p)) in enumerate(RECIPES.items()):
        for dropout in (0.0, p):
            name = recipe + (f"-drop{p:g}" if dropout else "")
            out[name] = TrainConfig(ArchSpec(arch, width, depth, dropout), epochs=epochs, lr=lr,
                                    optimizer=optimizer, label_noise=noise, train_size=size,
                                    batch_size=128, schedule="cosine", seed=seed)
    return out


def csv_row(name: str, meta: dict[str, str]) -> dict[str, str]:
    """One ``zoo.csv`` row from a checkpoint's header metadata."""
    row = {c: meta[c] for c in COLUMNS if c in meta}
    row.update(model=f"{name}.safetensors", source=SOURCE, dropout=meta.get("dropout", "0.0"),
               test_accuracy=f"{float(meta['test_accuracy']):.2f}",
               test_loss=f"{float(meta['test_loss']):.6f}")
    return {c: row[c] for c in COLUMNS}


def main(argv: list[str] | None = None) -> int:
    """Train every entry, write its file and ``zoo.csv``; return an exit code."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=REPO / "fixtures" / "fmnist-dropout-zoo")
    args = parser.parse_args(argv)

    if str(REPO) not in sys.path:  # run as a plain script from anywhere
        sys.path.insert(0, str(REPO))
    import torch

    from benchmarks.fashion_mnist.train import checkpoint_metadata, load_dataset, save_checkpoint, train

    torch.set_num_threads(1)
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    data = load_dataset()
    started = time.perf_counter()
    rows: dict[str, dict[str, str]] = {}
    seconds: dict[str, float] = {}
    for name, config in entries().items():
        result = train(config, data)
        meta = checkpoint_metadata(config, result, script=SCRIPT)
        save_checkpoint(result.model, out / f"{name}.safetensors", {**meta, "name": name})
        rows[name] = csv_row(name, meta)
        seconds[name] = round(result.seconds, 2)
        print(f"{name:40s} {result.test_accuracy:6.2f} %  loss {result.test_loss:.4f}  "
              f"{result.seconds:6.1f} s", file=sys.stderr, flush=True)

    with (out / "zoo.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows.values())
    (out / "train_log.json").write_text(json.dumps({
        "threads": 1, "torch_version": torch.__version__,
        "this_run_seconds": round(time.perf_counter() - started, 1), "seconds": seconds,
    }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
