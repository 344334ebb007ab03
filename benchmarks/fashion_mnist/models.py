"""The Fashion-MNIST architectures: fully connected MLPs and small CNNs.

Every network ends in a Linear layer named ``classifier`` (tensor ``classifier.weight``), its hidden
Linear layers are ``fc1``, ``fc2``, ... and its convolutions live in ``features`` (an
``nn.Sequential`` of conv, ReLU, max-pool blocks, so the convs are ``features.0``, ``features.3``,
...). A model is fully described by an :class:`ArchSpec`, which round-trips through a string dict so
it can be stored in a safetensors header and rebuilt from it.

- ``mlp``: ``depth`` hidden layers of ``width`` units each (ReLU), then the classifier.
- ``cnn``: ``depth`` blocks of 3x3 conv (padding 1) + ReLU + 2x2 max-pool with ``width * 2**i``
  channels in block ``i``, then ``fc1`` with ``8 * width`` units (ReLU), then the classifier.
  ``ArchSpec("cnn", width=16, depth=2)`` is Conv(1,16,3) / Conv(16,32,3) / Linear(32*7*7, 128) /
  Linear(128, 10): the default demo checkpoint.

``dropout`` > 0 adds an ``nn.Dropout(dropout)`` named ``dropout`` on the features the classifier
reads (after the last hidden ReLU, right before ``classifier``); it has no weights, so the state
dict is the same as without it. With the default 0 no such module exists and the metadata has no
``dropout`` key (the shipped zoo's headers round-trip unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wbfe.errors import InvalidOptionError, unknown_name

__all__ = ["ARCHS", "CNN", "MLP", "ArchSpec", "build_model", "count_params"]

ARCHS = ("mlp", "cnn")
IMAGE_SIDE = 28
NUM_CLASSES = 10


@dataclass(frozen=True)
class ArchSpec:
    """One architecture: its family, width and depth (see the module docstring for their meaning)."""

    arch: str
    width: int
    depth: int
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise unknown_name("architecture", self.arch, ARCHS)
        if self.width < 1:
            raise InvalidOptionError(f"width must be >= 1, got {self.width}", option="width")
        if self.depth < 1:
            raise InvalidOptionError(f"depth must be >= 1, got {self.depth}", option="depth")
        if not 0.0 <= self.dropout < 1.0:
            raise InvalidOptionError(f"dropout must be in [0, 1), got {self.dropout}", option="dropout")
        # Each CNN block halves the side (floor); below 1 pixel there is nothing left to pool.
        if self.arch == "cnn" and IMAGE_SIDE >> self.depth < 1:
            raise InvalidOptionError(f"cnn depth must be <= 4, got {self.depth}", option="depth")

    @property
    def name(self) -> str:
        """A short readable label, e.g. ``cnn-w16-d2``."""
        return f"{self.arch}-w{self.width}-d{self.depth}" + (f"-drop{self.dropout:g}" if self.dropout else "")

    def to_metadata(self) -> dict[str, str]:
        """The spec as a string dict (the form safetensors header metadata requires)."""
        meta = {"arch": self.arch, "width": str(self.width), "depth": str(self.depth)}
        return {**meta, "dropout": repr(self.dropout)} if self.dropout else meta

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> "ArchSpec":
        """Rebuild a spec from :meth:`to_metadata` output (extra keys are ignored)."""
        return cls(arch=meta["arch"], width=int(meta["width"]), depth=int(meta["depth"]),
                   dropout=float(meta.get("dropout", "0")))


class MLP(nn.Module):
    """``depth`` hidden Linear+ReLU layers ``fc1..fc<depth>`` of ``width`` units, then ``classifier``
    (with ``dropout`` > 0, an ``nn.Dropout`` between the last hidden layer and ``classifier``)."""

    def __init__(self, width: int, depth: int, dropout: float = 0.0) -> None:
        super().__init__()
        sizes = [IMAGE_SIDE * IMAGE_SIDE] + [width] * depth
        for i in range(depth):
            setattr(self, f"fc{i + 1}", nn.Linear(sizes[i], sizes[i + 1]))
        self.depth = depth
        self.dropout = nn.Dropout(dropout) if dropout else None
        self.classifier = nn.Linear(sizes[-1], NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for i in range(self.depth):
            x = torch.relu(getattr(self, f"fc{i + 1}")(x))
        if self.dropout is not None:
            x = self.dropout(x)
        return self.classifier(x)


class CNN(nn.Module):
    """``depth`` conv blocks in ``features``, then ``fc1`` (8·width units) and ``classifier``."""

    def __init__(self, width: int, depth: int, dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch, side = 1, IMAGE_SIDE
        for i in range(depth):
            out_ch = width * 2**i
            layers += [nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            in_ch, side = out_ch, side // 2
        self.features = nn.Sequential(*layers)
        self.fc1 = nn.Linear(in_ch * side * side, 8 * width)
        self.dropout = nn.Dropout(dropout) if dropout else None
        self.classifier = nn.Linear(8 * width, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(self.features(x).flatten(1)))
        if self.dropout is not None:
            x = self.dropout(x)
        return self.classifier(x)


def build_model(spec: ArchSpec) -> nn.Module:
    """Build the (randomly initialised) network described by ``spec``.

    Args:
        spec: family, width and depth.

    Returns:
        An :class:`MLP` or :class:`CNN` mapping (n, 1, 28, 28) float32 images to (n, 10) logits.
        Its initialisation draws from torch's global generator: seed it first for reproducible
        weights.
    """
    family = MLP if spec.arch == "mlp" else CNN
    return family(spec.width, spec.depth, spec.dropout)


def count_params(spec: ArchSpec) -> int:
    """Number of trainable parameters (weights and biases) of the network ``spec`` describes.

    Computed from the shapes alone, as an independent check on ``build_model``.
    """
    def linear(n_in: int, n_out: int) -> int:
        return n_in * n_out + n_out

    if spec.arch == "mlp":
        sizes = [IMAGE_SIDE * IMAGE_SIDE] + [spec.width] * spec.depth + [NUM_CLASSES]
        return sum(linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
    total, in_ch, side = 0, 1, IMAGE_SIDE
    for i in range(spec.depth):
        out_ch = spec.width * 2**i
        total += linear(in_ch * 9, out_ch)
        in_ch, side = out_ch, side // 2
    return total + linear(in_ch * side * side, 8 * spec.width) + linear(8 * spec.width, NUM_CLASSES)
