"""Train small Fashion-MNIST CNNs long enough to over-fit, saving a checkpoint and the test metrics every epoch.

The runs feed ``analyse.py`` (``wbfe watch`` with leave-one-seed-out λ). One torch thread, seeded:
same arguments, same torch build => the same checkpoints. Run from the repository root:

    .venv/bin/python benchmarks/dynamics/train_runs.py            # 3 seeds x {0, 0.3} label noise, 25 epochs
    .venv/bin/python benchmarks/dynamics/train_runs.py --tag sgdwd- --optimizer sgd --lr 0.05 \
        --weight-decay 5e-3 --noise 0.3 --epochs 20                # weight decay bounds the weight scale

Each run writes ``<runs>/<name>/epoch_<k>.safetensors`` (k = 0 is the initialisation) and
``<runs>/<name>/metrics.csv`` with columns ``step,test_loss,test_accuracy,train_loss``. The default
``<tmp>/wbfe-dynamics-runs`` keeps the checkpoints (~20 MB per run) out of git. Needs the Debian package
``dataset-fashion-mnist``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.fashion_mnist.train import Dataset

REPO = Path(__file__).resolve().parents[2]
# Checkpoints (~0.8 MB each, ~130 MB in all) stay out of the repository.
DEFAULT_RUNS = Path(tempfile.gettempdir()) / "wbfe-dynamics-runs"
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))


def train_run(*, seed: int, label_noise: float, epochs: int, train_size: int, width: int,
              lr: float, out: Path, data: Dataset, optimizer: str = "adam",
              weight_decay: float = 0.0) -> dict[str, object]:
    """Train one network at a constant learning rate and checkpoint it after every epoch.

    Args:
        seed: drives the initialisation, the training subset, the label noise and the batch order.
        label_noise: fraction of training labels replaced by another class.
        epochs: number of passes over the training subset.
        train_size: size of the random training subset (small => the network over-fits).
        width: CNN width (``ArchSpec("cnn", width, 2)``).
        lr: learning rate.
        optimizer: ``adam`` or ``sgd`` (momentum 0.9).
        weight_decay: L2 coefficient added to the gradient.
        out: the run folder (created).
        data: a ``benchmarks.fashion_mnist.train.Dataset``.

    Returns:
        The run's settings and per-epoch metrics.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F

    from benchmarks.fashion_mnist.models import ArchSpec, build_model
    from benchmarks.fashion_mnist.train import apply_label_noise, evaluate, save_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(seed)
    subset = np.sort(rng.permutation(len(data.train_x))[:train_size])
    labels = apply_label_noise(data.train_y.numpy()[subset], label_noise, rng)
    x, y = data.train_x[torch.from_numpy(subset)], torch.from_numpy(labels)
    torch.manual_seed(seed)
    spec = ArchSpec("cnn", width=width, depth=2)
    model = build_model(spec)
    opt: torch.optim.Optimizer
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    meta = {"arch": spec.name, "seed": str(seed), "label_noise": str(label_noise), "lr": str(lr),
            "train_size": str(train_size), "optimizer": optimizer, "weight_decay": str(weight_decay)}
    rows = []
    for epoch in range(epochs + 1):
        train_loss = math.nan
        if epoch > 0:
            model.train()
            order = torch.from_numpy(rng.permutation(len(x)))
            total = 0.0
            for start in range(0, len(x), 128):
                batch = order[start:start + 128]
                loss = F.cross_entropy(model(x[batch]), y[batch])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(batch)
            train_loss = total / len(x)
        acc, test_loss, _ = evaluate(model, data.test_x, data.test_y)
        save_checkpoint(model, out / f"epoch_{epoch}.safetensors", {**meta, "epoch": str(epoch)})
        rows.append({"step": epoch, "test_loss": test_loss, "test_accuracy": acc, "train_loss": train_loss})
        print(f"{out.name} epoch {epoch:3d} train {train_loss:.4f} test {test_loss:.4f} acc {acc:.2f}",
              file=sys.stderr, flush=True)
    with open(out / "metrics.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return {"run": out.name, **meta, "epochs": rows}


def main(argv: list[str] | None = None) -> int:
    """Train every (seed, label noise) run and write a summary JSON; return an exit code."""
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.3])
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--train-size", type=int, default=4000)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--tag", default="", help="prefix of the run names (and of the summary JSON)")
    args = parser.parse_args(argv)

    from benchmarks.fashion_mnist.train import load_dataset

    torch.set_num_threads(1)
    data = load_dataset()
    started = time.perf_counter()
    summary = []
    for noise in args.noise:
        for seed in args.seeds:
            name = f"{args.tag}noise{noise:g}-seed{seed}"
            summary.append(train_run(seed=seed, label_noise=noise, epochs=args.epochs,
                                     train_size=args.train_size, width=args.width, lr=args.lr,
                                     out=args.runs / name, data=data, optimizer=args.optimizer,
                                     weight_decay=args.weight_decay))
    record = {"script": "benchmarks/dynamics/train_runs.py", "threads": 1, "torch": torch.__version__,
              "seconds": round(time.perf_counter() - started, 1), "settings": vars(args) | {"runs": str(args.runs)},
              "runs": summary}
    result = REPO / "benchmarks" / "results" / "dynamics" / f"{args.tag}training.json"
    result.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"wrote {result} ({record['seconds']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
