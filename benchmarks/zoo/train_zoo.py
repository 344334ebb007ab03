"""Train the Fashion-MNIST model zoo shipped in ``fixtures/fmnist-zoo`` (what ``wbfe rank`` ranks).

Each entry of :data:`ZOO` is one small classifier (an MLP or a small CNN, head named
``classifier``) with its own seed; the entries vary width, depth, epochs, learning rate, optimizer,
weight decay, label noise and training-set size so that test accuracy spans a wide range. Every
model is trained with one CPU thread and deterministic algorithms, saved as
``<name>.safetensors`` (float32, the facts in its header metadata) and listed in ``zoo.csv``.
Run from the repository root (about 10 minutes on one core):

    .venv/bin/python benchmarks/zoo/train_zoo.py

``--only NAME`` retrains some entries and updates their rows in an existing ``zoo.csv``.
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
SCRIPT = "benchmarks/zoo/train_zoo.py"
SOURCE = f"trained by {SCRIPT}"
COLUMNS = ("model", "test_accuracy", "test_loss", "arch", "width", "depth", "epochs", "lr",
           "weight_decay", "label_noise", "train_size", "seed", "params", "optimizer",
           "batch_size", "schedule", "source")

# name: (arch, width, depth, epochs, optimizer, lr, weight_decay, label_noise, train_size)
# Seeds are the entry's position in this table. Batch size 128 and a cosine schedule throughout.
ZOO: dict[str, tuple[str, int, int, int, str, float, float, float, int]] = {
    # MLPs on the full training set: width and depth
    "mlp-w16-d1": ("mlp", 16, 1, 10, "adam", 1e-3, 0.0, 0.0, 60000),
    "mlp-w32-d1": ("mlp", 32, 1, 10, "adam", 1e-3, 0.0, 0.0, 60000),
    "mlp-w64-d1": ("mlp", 64, 1, 10, "adam", 1e-3, 0.0, 0.0, 60000),
    "mlp-w128-d1": ("mlp", 128, 1, 10, "adam", 1e-3, 0.0, 0.0, 60000),
    "mlp-w64-d2": ("mlp", 64, 2, 10, "adam", 1e-3, 0.0, 0.0, 60000),
    "mlp-w64-d3": ("mlp", 64, 3, 10, "adam", 1e-3, 0.0, 0.0, 60000),
    "mlp-w32-d4": ("mlp", 32, 4, 10, "adam", 1e-3, 0.0, 0.0, 60000),
    # the same recipe as mlp-w64-d1 with another seed: the seed-to-seed spread
    "mlp-w64-d1-rep2": ("mlp", 64, 1, 10, "adam", 1e-3, 0.0, 0.0, 60000),
    # MLPs: under-training (few epochs, small learning rate) and a too-large learning rate
    "mlp-w64-d1-e1-sgd-lr0.002": ("mlp", 64, 1, 1, "sgd", 2e-3, 0.0, 0.0, 60000),
    "mlp-w64-d1-e2-sgd-lr0.01": ("mlp", 64, 1, 2, "sgd", 1e-2, 0.0, 0.0, 60000),
    "mlp-w64-d2-adam-lr0.02": ("mlp", 64, 2, 10, "adam", 2e-2, 0.0, 0.0, 60000),
    # MLPs: SGD with weight decay, from light to heavy
    "mlp-w64-d1-sgd-wd0.0005": ("mlp", 64, 1, 10, "sgd", 5e-2, 5e-4, 0.0, 60000),
    "mlp-w64-d1-sgd-wd0.01": ("mlp", 64, 1, 10, "sgd", 5e-2, 1e-2, 0.0, 60000),
    "mlp-w64-d1-adamw-wd0.5": ("mlp", 64, 1, 10, "adamw", 1e-3, 0.5, 0.0, 60000),
    # MLPs: smaller training sets (trained longer)
    "mlp-w64-d1-n10000": ("mlp", 64, 1, 20, "adam", 1e-3, 0.0, 0.0, 10000),
    "mlp-w64-d1-n3000": ("mlp", 64, 1, 40, "adam", 1e-3, 0.0, 0.0, 3000),
    "mlp-w64-d1-n1000": ("mlp", 64, 1, 60, "adam", 1e-3, 0.0, 0.0, 1000),
    # MLPs: label noise, with and without the capacity and time to memorise it
    "mlp-w64-d2-noise0.2": ("mlp", 64, 2, 10, "adam", 1e-3, 0.0, 0.2, 60000),
    "mlp-w128-d2-noise0.4-n5000": ("mlp", 128, 2, 60, "adam", 1e-3, 0.0, 0.4, 5000),
    "mlp-w32-d2-noise0.6-n3000": ("mlp", 32, 2, 60, "adam", 1e-3, 0.0, 0.6, 3000),
    # CNNs on the full training set: width and depth (SGD + momentum 0.9, weight decay 5e-4)
    "cnn-w4-d1": ("cnn", 4, 1, 8, "sgd", 5e-2, 5e-4, 0.0, 60000),
    "cnn-w8-d1": ("cnn", 8, 1, 8, "sgd", 5e-2, 5e-4, 0.0, 60000),
    "cnn-w4-d2": ("cnn", 4, 2, 8, "sgd", 5e-2, 5e-4, 0.0, 60000),
    "cnn-w6-d2": ("cnn", 6, 2, 8, "sgd", 5e-2, 5e-4, 0.0, 60000),
    "cnn-w8-d2": ("cnn", 8, 2, 8, "sgd", 5e-2, 5e-4, 0.0, 60000),
    "cnn-w10-d2": ("cnn", 10, 2, 8, "sgd", 5e-2, 5e-4, 0.0, 60000),
    "cnn-w6-d3": ("cnn", 6, 3, 8, "sgd", 5e-2, 5e-4, 0.0, 60000),
    # CNNs: other optimizer, no weight decay, under-training, small data, label noise
    "cnn-w8-d2-adam-e5": ("cnn", 8, 2, 5, "adam", 1e-3, 0.0, 0.0, 60000),
    "cnn-w8-d2-sgd-wd0-e5": ("cnn", 8, 2, 5, "sgd", 5e-2, 0.0, 0.0, 60000),
    "cnn-w8-d2-e1-sgd-lr0.005": ("cnn", 8, 2, 1, "sgd", 5e-3, 0.0, 0.0, 60000),
    "cnn-w8-d2-n2000": ("cnn", 8, 2, 30, "adam", 1e-3, 0.0, 0.0, 2000),
    "cnn-w8-d2-noise0.2": ("cnn", 8, 2, 5, "adam", 1e-3, 0.0, 0.2, 60000),
    "cnn-w8-d2-noise0.5-n5000": ("cnn", 8, 2, 40, "adam", 1e-3, 0.0, 0.5, 5000),
}


def entry_config(name: str) -> "TrainConfig":
    """The :class:`TrainConfig` of one zoo entry (its seed is its position in :data:`ZOO`)."""
    from benchmarks.fashion_mnist.models import ArchSpec
    from benchmarks.fashion_mnist.train import TrainConfig

    arch, width, depth, epochs, optimizer, lr, wd, noise, size = ZOO[name]
    return TrainConfig(ArchSpec(arch, width, depth), epochs=epochs, lr=lr, optimizer=optimizer,
                       weight_decay=wd, label_noise=noise, train_size=size, batch_size=128,
                       schedule="cosine", seed=list(ZOO).index(name))


def csv_row(name: str, meta: dict[str, str]) -> dict[str, str]:
    """One ``zoo.csv`` row from a checkpoint's header metadata."""
    row = {c: meta[c] for c in COLUMNS if c in meta}
    row.update(model=f"{name}.safetensors", source=SOURCE,
               test_accuracy=f"{float(meta['test_accuracy']):.2f}",
               test_loss=f"{float(meta['test_loss']):.6f}")
    return {c: row[c] for c in COLUMNS}


def main(argv: list[str] | None = None) -> int:
    """Train the requested entries, write their files and (re)write ``zoo.csv``; return an exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=REPO / "fixtures" / "fmnist-zoo")
    parser.add_argument("--only", action="append", choices=sorted(ZOO), metavar="NAME",
                        help="train only this entry (repeatable); other rows of zoo.csv are kept")
    args = parser.parse_args(argv)

    if str(REPO) not in sys.path:  # run as a plain script from anywhere
        sys.path.insert(0, str(REPO))
    import torch

    from benchmarks.fashion_mnist.train import (checkpoint_metadata, load_dataset,
                                                save_checkpoint, train)

    torch.set_num_threads(1)
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    csv_path, log_path = out / "zoo.csv", out / "train_log.json"
    rows: dict[str, dict[str, str]] = {}
    log: dict[str, float] = {}
    if args.only and csv_path.is_file():
        with csv_path.open(newline="") as fh:
            rows = {r["model"].removesuffix(".safetensors"): r for r in csv.DictReader(fh)}
        if log_path.is_file():
            log = json.loads(log_path.read_text())["seconds"]

    data = load_dataset()
    started = time.perf_counter()
    for name in args.only or list(ZOO):
        config = entry_config(name)
        result = train(config, data)
        meta = checkpoint_metadata(config, result, script=SCRIPT)
        save_checkpoint(result.model, out / f"{name}.safetensors", {**meta, "name": name})
        rows[name] = csv_row(name, meta)
        log[name] = round(result.seconds, 2)
        print(f"{name:32s} {result.test_accuracy:6.2f} %  loss {result.test_loss:.4f}  "
              f"{result.seconds:6.1f} s", file=sys.stderr, flush=True)

    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows[n] for n in ZOO if n in rows)
    log_path.write_text(json.dumps({
        "threads": 1, "torch_version": torch.__version__,
        "this_run_seconds": round(time.perf_counter() - started, 1),
        "seconds": {n: log[n] for n in ZOO if n in log},
    }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
