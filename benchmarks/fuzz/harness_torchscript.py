"""Fuzz the TorchScript archive reader: one ``model.torchscript`` (read without running its code)."""

from __future__ import annotations

import io

from benchmarks.fuzz.common import check_source, put

NAME = "torchscript"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a TorchScript archive; raise on a finding."""
    check_source(put("model.torchscript", data))


def seeds() -> dict[str, bytes]:
    """Archives written by ``torch.jit.save`` (a scripted MLP with a constant, a traced CNN)."""
    import torch

    torch.manual_seed(3)

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(6, 10)
            self.fc2 = torch.nn.Linear(10, 3, bias=False)
            self.scale = torch.nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.relu(self.fc1(x))) * self.scale + torch.tensor([1.0, 2.0, 3.0])

    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 4 * 4, 5)).eval()
    out = {}
    modules = (("mlp.pt", torch.jit.script(Mlp())), ("cnn.pt", torch.jit.trace(cnn, torch.randn(1, 3, 6, 6))))
    for name, module in modules:
        buffer = io.BytesIO()
        torch.jit.save(module, buffer)
        out[name] = buffer.getvalue()
    return out
