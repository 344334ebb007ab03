"""The CIFAR-10 ResNets of the shared zoo (``$WBFE_SHARED_ZOO/cifar10-resnet``) as ``nn.Module``s.

The checkpoints come from github.com/akamaster/pytorch_resnet_cifar10 (He et al. 2016, §4.2: three
stages of ``n`` basic blocks with 16, 32 and 64 channels, option-A shortcuts: stride-2 subsampling
and zero-padded channels, no weights), whose ``resnet.py`` is not shipped with them. This is that
standard definition, with the repository's module names (``conv1``, ``bn1``, ``layer1.0.conv1``...,
``linear``) so the state dicts load with ``strict=True``: ResNet-``6n+2`` has ``n`` blocks a stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from wbfe.errors import InvalidOptionError

__all__ = ["DEPTHS", "ResNet", "build_resnet", "load_resnet"]

DEPTHS = (20, 32, 44, 56, 110)


class _Shortcut(nn.Module):
    """Option A: subsample by 2 and zero-pad the new channels (no weights)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class BasicBlock(nn.Module):
    """Two 3×3 conv + batch-norm layers and the identity (or option-A) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_planes != planes:
            pad = planes // 4
            self.shortcut = _Shortcut(lambda x: F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, pad, pad), "constant", 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """conv1 → three stages (16, 32, 64 channels) → global average pool → ``linear`` (the head)."""

    def __init__(self, blocks: int, num_classes: int = 10) -> None:
        super().__init__()
        self.in_planes = 16
        self.conv1 = nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._stage(16, blocks, 1)
        self.layer2 = self._stage(32, blocks, 2)
        self.layer3 = self._stage(64, blocks, 2)
        self.linear = nn.Linear(64, num_classes)

    def _stage(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.avg_pool2d(out, out.size()[3]).flatten(1)
        return self.linear(out)


def build_resnet(depth: int) -> ResNet:
    """ResNet-``depth`` for CIFAR-10 (``depth`` = 6n + 2, one of :data:`DEPTHS`), randomly initialised."""
    if depth not in DEPTHS:
        raise InvalidOptionError(f"CIFAR ResNet depth must be one of {DEPTHS}, got {depth}", option="depth")
    return ResNet((depth - 2) // 6)


def load_resnet(path: "str | Path") -> ResNet:
    """The ResNet of a shared-zoo safetensors file (``resnet56.safetensors``), its weights loaded strictly.

    Raises:
        InvalidOptionError: the file name does not say the depth (``resnet<depth>``).
    """
    from safetensors.torch import load_file

    stem = Path(path).stem
    if not stem.startswith("resnet") or not stem[6:].isdigit():
        raise InvalidOptionError(f"{path}: expected a file named resnet<depth>.safetensors", option="path")
    model = build_resnet(int(stem[6:]))
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.eval()
