"""A seeded, deterministic Fashion-MNIST trainer and evaluator.

Same :class:`TrainConfig`, same thread count, same torch build => bitwise the same weights: the
initialisation is drawn after ``torch.manual_seed(seed)``, every data-side random choice (training
subset, label noise, batch order) comes from ``numpy.random.default_rng(seed)``, and torch runs
with ``use_deterministic_algorithms(True)``. CPU reductions can depend on the number of threads, so
the scripts that make the shipped checkpoints pin it to one and record it.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wbfe.errors import InvalidOptionError, unknown_name

from .data import load_split, normalize
from .models import ArchSpec, build_model

if TYPE_CHECKING:
    import torch

__all__ = [
    "OPTIMIZERS",
    "SCHEDULES",
    "Dataset",
    "TrainConfig",
    "TrainResult",
    "apply_label_noise",
    "evaluate",
    "checkpoint_metadata",
    "load_dataset",
    "save_checkpoint",
    "train",
]

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "cosine")
FULL_TRAIN_SIZE = 60_000


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a trained network (with the thread count and torch build).

    ``weight_decay`` is L2 added to the gradient for ``sgd`` and ``adam`` and decoupled for
    ``adamw``; ``label_noise`` is the fraction of training labels replaced by a different class
    drawn uniformly; ``train_size`` is the size of the random training subset (at most 60,000).
    """

    spec: ArchSpec
    epochs: int = 5
    lr: float = 1e-3
    optimizer: str = "adam"
    weight_decay: float = 0.0
    momentum: float = 0.9
    label_noise: float = 0.0
    train_size: int = FULL_TRAIN_SIZE
    batch_size: int = 128
    schedule: str = "cosine"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise unknown_name("optimizer", self.optimizer, OPTIMIZERS)
        if self.schedule not in SCHEDULES:
            raise unknown_name("schedule", self.schedule, SCHEDULES)
        checks = {
            "epochs": self.epochs >= 1,
            "lr": self.lr > 0,
            "weight_decay": self.weight_decay >= 0,
            "momentum": 0 <= self.momentum < 1,
            "label_noise": 0 <= self.label_noise < 1,
            "train_size": 1 <= self.train_size <= FULL_TRAIN_SIZE,
            "batch_size": self.batch_size >= 1,
        }
        for option, ok in checks.items():
            if not ok:
                raise InvalidOptionError(
                    f"{option} out of range: {getattr(self, option)!r}", option=option
                )

    def to_metadata(self) -> dict[str, str]:
        """The config as a flat string dict (architecture keys included) for safetensors metadata."""
        settings = {k: str(v) for k, v in asdict(self).items() if k != "spec"}
        return {**self.spec.to_metadata(), **settings}


@dataclass(frozen=True)
class Dataset:
    """Fashion-MNIST as normalised float32 tensors (n, 1, 28, 28) and int64 label tensors."""

    train_x: "torch.Tensor"
    train_y: "torch.Tensor"
    test_x: "torch.Tensor"
    test_y: "torch.Tensor"


@dataclass
class TrainResult:
    """A trained network and what was measured on the 10,000 test images."""

    model: "torch.nn.Module"
    test_accuracy: float  # percent, = 100 * test_correct / test_total
    test_loss: float  # mean cross-entropy over the test set (natural log)
    test_correct: int
    test_total: int
    final_train_loss: float  # mean loss over the last epoch (on the possibly noisy labels)
    seconds: float
    threads: int


def load_dataset(*, test_only: bool = False) -> Dataset:
    """Load and normalise Fashion-MNIST from the Debian package's IDX files.

    Args:
        test_only: skip the 60k training images (the train tensors are then empty).

    Returns:
        A :class:`Dataset`.

    Raises:
        SourceNotFoundError: the IDX files are not installed.
    """
    import torch

    test_images, test_labels = load_split("test")
    if test_only:
        train_x = torch.empty((0, 1, 28, 28), dtype=torch.float32)
        train_y = torch.empty((0,), dtype=torch.int64)
    else:
        train_images, train_labels = load_split("train")
        train_x, train_y = torch.from_numpy(normalize(train_images)), torch.from_numpy(train_labels)
    return Dataset(train_x, train_y, torch.from_numpy(normalize(test_images)),
                   torch.from_numpy(test_labels))


def apply_label_noise(
    labels: np.ndarray, fraction: float, rng: np.random.Generator, num_classes: int = 10
) -> np.ndarray:
    """Replace a fraction of labels by a different class drawn uniformly (symmetric noise).

    Args:
        labels: integer labels in ``0..num_classes-1``.
        fraction: share of labels to corrupt, rounded to the nearest count.
        rng: the random source (which labels, which new class).
        num_classes: number of classes.

    Returns:
        A new array; exactly ``round(fraction * len(labels))`` entries differ from ``labels``.
    """
    noisy = labels.copy()
    count = int(round(fraction * len(labels)))
    idx = rng.choice(len(labels), size=count, replace=False)
    # An offset in 1..K-1 modulo K never maps a label to itself and hits every other class equally.
    noisy[idx] = (labels[idx] + rng.integers(1, num_classes, size=count)) % num_classes
    return noisy


def evaluate(
    model: "torch.nn.Module", x: "torch.Tensor", y: "torch.Tensor", *, batch_size: int = 1000
) -> tuple[float, float, int]:
    """Accuracy and mean cross-entropy of ``model`` on ``(x, y)``.

    Args:
        model: maps (n, 1, 28, 28) float32 inputs to (n, 10) logits.
        x: normalised images.
        y: int64 labels.
        batch_size: images per forward pass (does not change the result beyond float rounding).

    Returns:
        ``(accuracy_percent, mean_loss, correct)``.
    """
    import torch
    import torch.nn.functional as F

    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            logits = model(x[start : start + batch_size])
            target = y[start : start + batch_size]
            correct += int((logits.argmax(dim=1) == target).sum())
            loss_sum += float(F.cross_entropy(logits.double(), target, reduction="sum"))
    return 100.0 * correct / len(x), loss_sum / len(x), correct


def _optimizer(config: TrainConfig, params: "list[torch.nn.Parameter]") -> "torch.optim.Optimizer":
    import torch

    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def train(config: TrainConfig, data: Dataset) -> TrainResult:
    """Train one network from scratch and evaluate it on the test set.

    Args:
        config: architecture and training settings, including the seed.
        data: the loaded dataset (see :func:`load_dataset`); it is not modified.

    Returns:
        A :class:`TrainResult` with the trained model (in eval mode) and its test metrics.
    """
    import torch
    import torch.nn.functional as F

    started = time.perf_counter()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        rng = np.random.default_rng(config.seed)
        subset = np.sort(rng.permutation(len(data.train_x))[: config.train_size])
        labels = apply_label_noise(data.train_y.numpy()[subset], config.label_noise, rng)
        x, y = data.train_x[torch.from_numpy(subset)], torch.from_numpy(labels)

        torch.manual_seed(config.seed)
        model = build_model(config.spec)
        opt = _optimizer(config, list(model.parameters()))
        steps_per_epoch = math.ceil(len(x) / config.batch_size)
        total_steps = steps_per_epoch * config.epochs
        sched = None
        if config.schedule == "cosine":
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda step: 0.5 * (1.0 + math.cos(math.pi * step / total_steps))
            )

        epoch_loss = math.nan
        for _ in range(config.epochs):
            model.train()
            order = torch.from_numpy(rng.permutation(len(x)))
            loss_sum = 0.0
            for start in range(0, len(x), config.batch_size):
                batch = order[start : start + config.batch_size]
                loss = F.cross_entropy(model(x[batch]), y[batch])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if sched is not None:
                    sched.step()
                loss_sum += loss.item() * len(batch)
            epoch_loss = loss_sum / len(x)

        acc, test_loss, correct = evaluate(model, data.test_x, data.test_y)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    return TrainResult(
        model=model,
        test_accuracy=acc,
        test_loss=test_loss,
        test_correct=correct,
        test_total=len(data.test_x),
        final_train_loss=epoch_loss,
        seconds=time.perf_counter() - started,
        threads=torch.get_num_threads(),
    )


def checkpoint_metadata(config: TrainConfig, result: TrainResult, *, script: str) -> dict[str, str]:
    """The facts stored with a checkpoint, as the string dict safetensors header metadata needs.

    Args:
        config: how the network was trained.
        result: what training measured.
        script: the repository-relative path of the script that made the checkpoint.

    Returns:
        Architecture, training settings, test metrics, software versions and the input transform;
        no timestamps or host names, so a re-run writes identical bytes.
    """
    import torch

    from .data import MEAN, STD

    return {
        "format": "pt",
        "architecture": config.spec.name,
        **config.to_metadata(),
        "params": str(sum(p.numel() for p in result.model.parameters())),
        "test_accuracy": repr(round(result.test_accuracy, 4)),
        "test_loss": repr(round(result.test_loss, 6)),
        "test_correct": str(result.test_correct),
        "test_total": str(result.test_total),
        "dataset": "Fashion-MNIST (Debian package dataset-fashion-mnist; MIT licence, (c) Zalando SE)",
        "preprocessing": f"x = (pixel / 255 - {MEAN}) / {STD}, shape (n, 1, 28, 28)",
        "threads": str(result.threads),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "script": script,
    }


def save_checkpoint(model: "torch.nn.Module", path: "str | Path", metadata: dict[str, str]) -> None:
    """Write ``model``'s float32 state dict to a safetensors file with ``metadata`` in its header.

    Args:
        model: the trained network.
        path: destination ``.safetensors`` file (its folder must exist).
        metadata: string keys and values (see :func:`checkpoint_metadata`).
    """
    import torch
    from safetensors.torch import save_file

    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata=metadata)
