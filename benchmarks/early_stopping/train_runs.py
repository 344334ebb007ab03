"""Train the early-stopping evaluation set: small networks with one checkpoint per epoch and held-out metrics.

Three families (``mlp``, ``cnn``, ``resnet``) on two offline data sets (Fashion-MNIST from the Debian
package ``dataset-fashion-mnist``; scikit-learn's bundled 8x8 ``digits``), each in two regimes:

- ``bn-sgd``: BatchNorm after every hidden layer, SGD (momentum 0.9) with weight decay — the regime of
  the BFE-W paper's ResNets, where BatchNorm makes the layers scale-invariant and weight decay shrinks
  their norms;
- ``adam``: no normalisation, Adam without weight decay — norms grow during training.

Each (data set, family, regime) is trained clean and with a small, label-noisy training subset (the
over-fitting runs). Every run writes ``<runs>/<name>/epoch_<k>.safetensors`` (k = 0 is the
initialisation) and ``<runs>/<name>/metrics.csv`` with ``step, test_loss, test_accuracy, val_loss,
val_accuracy, train_loss`` (the run CSV ``wbfe watch`` reads); the per-checkpoint metrics of all runs
are also written to ``benchmarks/results/early_stopping_runs.csv`` (committed; the checkpoints are
regenerated, never committed). The validation split is drawn from the training pool, disjoint from
the training subset; the test split is the data set's own (Fashion-MNIST: a fixed random 5,000 of its
10,000 test images).

One torch thread, seeded: same arguments, same torch build => the same checkpoints. From the repository root:

    nice -n 10 .venv/bin/python benchmarks/early_stopping/train_runs.py      # all 24 runs
    .venv/bin/python benchmarks/early_stopping/train_runs.py --only digits-mlp   # a subset, by name prefix
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))
DEFAULT_RUNS = Path(__file__).resolve().parent / "runs"  # git-ignored
RESULTS_CSV = REPO / "benchmarks" / "results" / "early_stopping_runs.csv"
RESULTS_JSON = REPO / "benchmarks" / "results" / "early_stopping_training.json"
FIELDS = ("run", "step", "test_loss", "test_accuracy", "val_loss", "val_accuracy", "train_loss")


@dataclass(frozen=True)
class RunSpec:
    """One training run: everything that determines its checkpoints (with the seed and torch build)."""

    dataset: str  # fmnist | digits
    family: str  # mlp | cnn | resnet
    regime: str  # bn-sgd | adam
    train_size: int
    label_noise: float
    epochs: int
    seed: int

    @property
    def name(self) -> str:
        noise = f"noise{self.label_noise:g}" if self.label_noise else "clean"
        return f"{self.dataset}-{self.family}-{self.regime}-{noise}-n{self.train_size}-s{self.seed}"


def default_specs() -> list[RunSpec]:
    """The 24 runs: 2 data sets x 3 families x 2 regimes x {clean, small noisy subset}."""
    specs = []
    for dataset, clean_n, noisy_n, epochs in (("digits", 700, 300, 30), ("fmnist", 2000, 600, 25)):
        for k, family in enumerate(("mlp", "cnn", "resnet")):
            for j, regime in enumerate(("adam", "bn-sgd")):
                seed = 10 * k + j
                specs.append(RunSpec(dataset, family, regime, clean_n, 0.0, epochs, seed))
                specs.append(RunSpec(dataset, family, regime, noisy_n, 0.4, epochs, seed + 100))
    return specs


def load_data(dataset: str, fmnist_root: Path) -> dict[str, Any]:
    """The data set as float32 tensors: a training pool, a test split, the input shape."""
    import numpy as np
    import torch

    if dataset == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = (bunch.images.astype(np.float32) / 16.0 - 0.5) / 0.5
        y = bunch.target.astype(np.int64)
        order = np.random.default_rng(12345).permutation(len(x))
        test, pool = order[:700], order[700:]  # fixed split: 700 test, 1,097 in the training pool
        return {"pool_x": torch.from_numpy(x[pool][:, None]), "pool_y": torch.from_numpy(y[pool]),
                "test_x": torch.from_numpy(x[test][:, None]), "test_y": torch.from_numpy(y[test]), "side": 8}
    from benchmarks.fashion_mnist.data import load_split, normalize

    train_images, train_labels = load_split("train", fmnist_root)
    test_images, test_labels = load_split("test", fmnist_root)
    test = np.sort(np.random.default_rng(12345).permutation(len(test_images))[:5000])
    return {"pool_x": torch.from_numpy(normalize(train_images)), "pool_y": torch.from_numpy(train_labels),
            "test_x": torch.from_numpy(normalize(test_images[test])), "test_y": torch.from_numpy(test_labels[test]),
            "side": 28}


def build(family: str, norm: bool, side: int) -> Any:
    """A small network of the family, with BatchNorm after every hidden layer when ``norm``."""
    import torch
    from torch import nn

    def bn1(n: int) -> nn.Module:
        return nn.BatchNorm1d(n) if norm else nn.Identity()

    def bn2(n: int) -> nn.Module:
        return nn.BatchNorm2d(n) if norm else nn.Identity()

    if family == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(side * side, 128), bn1(128), nn.ReLU(),
                             nn.Linear(128, 64), bn1(64), nn.ReLU(), nn.Linear(64, 10))
    if family == "cnn":
        pooled = (side // 4) ** 2 * 32
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), bn2(16), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), bn2(32), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(pooled, 64), bn1(64), nn.ReLU(), nn.Linear(64, 10))

    class Block(nn.Module):
        def __init__(self, c_in: int, c_out: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=not norm)
            self.bn1 = bn2(c_out)
            self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=not norm)
            self.bn2 = bn2(c_out)
            self.short = (nn.Identity() if stride == 1 and c_in == c_out else
                          nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=not norm), bn2(c_out)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + self.short(x))

    stride = 2 if side > 8 else 1
    return nn.Sequential(nn.Conv2d(1, 16, 3, stride=stride, padding=1, bias=not norm), bn2(16), nn.ReLU(),
                         Block(16, 16, 1), Block(16, 32, 2), Block(32, 32, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def evaluate(model: Any, x: Any, y: Any) -> tuple[float, float]:
    """(mean cross-entropy, accuracy in [0, 1]) of ``model`` on ``(x, y)``."""
    import torch
    import torch.nn.functional as F

    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(x), 1000):
            logits = model(x[start:start + 1000])
            loss += float(F.cross_entropy(logits.double(), y[start:start + 1000], reduction="sum"))
            correct += int((logits.argmax(1) == y[start:start + 1000]).sum())
    return loss / len(x), correct / len(x)


def train_run(spec: RunSpec, data: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """Train one run, checkpointing after every epoch; return its per-checkpoint metrics."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from benchmarks.fashion_mnist.train import apply_label_noise, save_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(spec.seed)
    order = rng.permutation(len(data["pool_x"]))
    val_n = min(1000, len(order) - spec.train_size)
    train_idx, val_idx = np.sort(order[:spec.train_size]), np.sort(order[spec.train_size:spec.train_size + val_n])
    labels = apply_label_noise(data["pool_y"].numpy()[train_idx], spec.label_noise, rng)
    x, y = data["pool_x"][torch.from_numpy(train_idx)], torch.from_numpy(labels)
    vx, vy = data["pool_x"][torch.from_numpy(val_idx)], data["pool_y"][torch.from_numpy(val_idx)]
    torch.manual_seed(spec.seed)
    norm = spec.regime == "bn-sgd"
    model = build(spec.family, norm, data["side"])
    opt: torch.optim.Optimizer
    if norm:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    meta = {k: str(v) for k, v in asdict(spec).items()}
    rows = []
    for epoch in range(spec.epochs + 1):
        train_loss = math.nan
        if epoch > 0:
            model.train()
            perm = torch.from_numpy(rng.permutation(len(x)))
            total = 0.0
            for start in range(0, len(x), 64):
                batch = perm[start:start + 64]
                if len(batch) < 2:  # BatchNorm needs two samples
                    continue
                loss = F.cross_entropy(model(x[batch]), y[batch])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(batch)
            train_loss = total / len(x)
        test_loss, test_acc = evaluate(model, data["test_x"], data["test_y"])
        val_loss, val_acc = evaluate(model, vx, vy)
        save_checkpoint(model, out / f"epoch_{epoch}.safetensors", {**meta, "epoch": str(epoch)})
        rows.append({"step": epoch, "test_loss": test_loss, "test_accuracy": test_acc, "val_loss": val_loss,
                     "val_accuracy": val_acc, "train_loss": train_loss})
        print(f"{spec.name} epoch {epoch:3d} train {train_loss:.4f} val {val_loss:.4f} test {test_loss:.4f} "
              f"acc {test_acc:.3f}", file=sys.stderr, flush=True)
    with open(out / "metrics.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Train the selected runs; write the committed per-checkpoint metrics; return an exit code."""
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="folder for the run folders (checkpoints)")
    parser.add_argument("--fmnist-root", type=Path, default=Path("/usr/share/datasets/fashion-mnist"),
                        help="folder of the Fashion-MNIST IDX files")
    parser.add_argument("--only", default="", help="train only the runs whose name starts with this")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    specs = [s for s in default_specs() if s.name.startswith(args.only)]
    started = time.perf_counter()
    data: dict[str, Any] = {}
    for spec in specs:
        if spec.dataset not in data:
            data[spec.dataset] = load_data(spec.dataset, args.fmnist_root)
        t0 = time.perf_counter()
        rows = train_run(spec, data[spec.dataset], args.runs / spec.name)
        (args.runs / spec.name / "run.json").write_text(json.dumps(
            {"run": spec.name, **asdict(spec), "seconds": round(time.perf_counter() - t0, 1),
             "best_test_epoch": min(rows, key=lambda r: r["test_loss"])["step"]}) + "\n")
    # The committed table holds every run of the default set trained so far (several processes may train
    # disjoint subsets side by side; whichever finishes last writes them all).
    rows_out = []
    for spec in default_specs():
        metrics = args.runs / spec.name / "metrics.csv"
        if metrics.is_file():
            with open(metrics, newline="") as fh:
                rows_out += [{"run": spec.name, **r} for r in csv.DictReader(fh)]
    with open(RESULTS_CSV, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows_out)
    done = [args.runs / s.name / "run.json" for s in default_specs()]
    summary = {"script": "benchmarks/early_stopping/train_runs.py", "threads": 1, "torch": torch.__version__,
               "runs": [json.loads(p.read_text()) for p in done if p.is_file()]}
    RESULTS_JSON.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"trained {len(specs)} runs in {time.perf_counter() - started:.0f} s; wrote {RESULTS_CSV}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
