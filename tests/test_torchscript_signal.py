"""Signal-processing constants in TorchScript archives (wbfe/sources/torchscript_files.py): an STFT
basis a scripted module registers as a buffer and convolves with is skipped with the very reason the
ONNX reader gives the same buffer in the module's ONNX export (wbfe/sources/onnx_graph.py), never
scored as a convolution; the Linear beside it, and a trainable Parameter holding the same values,
are scored."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import wbfe
from wbfe.sources import open_source

N_FFT = 16


def _stft_basis(n_fft: int) -> torch.Tensor:
    """Hann-windowed real DFT basis, cos rows then −sin rows, as a Conv1d weight [2·bins, 1, n_fft]."""
    k = np.arange(n_fft // 2 + 1)[:, None]
    t = np.arange(n_fft)[None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    basis = np.concatenate([window * np.cos(2 * np.pi * k * t / n_fft), -window * np.sin(2 * np.pi * k * t / n_fft)])
    return torch.tensor(basis, dtype=torch.float32)[:, None, :]


class Frontend(nn.Module):
    def __init__(self, trainable: bool = False) -> None:
        super().__init__()
        if trainable:
            self.basis = nn.Parameter(_stft_basis(N_FFT))  # learned (initialised as a DFT): a weight
        else:
            self.register_buffer("basis", _stft_basis(N_FFT))  # a name that says nothing: found by its values

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return nn.functional.conv1d(audio, self.basis, stride=8)  # hop N_FFT / 2 (a literal: TorchScript)


class Vad(nn.Module):
    def __init__(self, trainable: bool = False) -> None:
        super().__init__()
        self.frontend = Frontend(trainable)
        self.register_buffer("forward_basis_buffer", torch.randn(2 * (N_FFT // 2 + 1), 1, N_FFT))  # Silero's name
        self.fc = nn.Linear(2 * (N_FFT // 2 + 1), 3)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        spec = self.frontend(audio) + nn.functional.conv1d(audio, self.forward_basis_buffer, stride=8)
        return self.fc(spec.mean(-1))


def _script(tmp_path: Path, net: nn.Module) -> Path:
    path = tmp_path / "vad.jit"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(net).save(str(path))
    return path


def _skips(path: Path) -> dict[str, object]:
    with open_source(path) as source:
        return {e.name: e.skip for e in source.entries()}


def test_an_stft_basis_buffer_is_skipped_with_the_onnx_readers_reason(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    torch.manual_seed(0)
    net = Vad().eval()
    jit = _script(tmp_path, net)
    exported = tmp_path / "vad.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(1, 1, 64),), str(exported), dynamo=False)
    assert {i.name for i in onnx.load(str(exported)).graph.initializer} >= {"frontend.basis", "forward_basis_buffer"}
    by_onnx, by_jit = _skips(exported), _skips(jit)
    for name in ("frontend.basis", "forward_basis_buffer"):
        assert by_jit[name] is not None and by_jit[name].startswith("signal-processing constant (")
        assert by_jit[name] == by_onnx[name]
    assert "windowed DFT basis" in by_jit["frontend.basis"] and "(forward_basis:" in by_jit["forward_basis_buffer"]
    assert by_jit["fc.weight"] is None
    result = wbfe.score(jit)
    assert [row["name"] for row in result.layers] == ["fc.weight"]
    assert result.summary["n_layers"] == 1  # the basis counts in no mean (it was a conv with BFE-W +inf)


def test_a_trainable_parameter_with_the_same_values_is_scored(tmp_path: Path) -> None:
    torch.manual_seed(0)
    skips = _skips(_script(tmp_path, Vad(trainable=True)))
    assert skips["frontend.basis"] is None and skips["fc.weight"] is None
    assert skips["forward_basis_buffer"] is not None  # still a buffer, named as a basis


def test_damaged_code_records_leave_their_classes_undeclared_and_every_tensor_checked(tmp_path: Path) -> None:
    """The code is read only for what each class declares: code records failing their CRC do not
    make the archive unreadable; their classes' tensors are checked as the ONNX reader checks all,
    so the trainable basis (a Parameter no declaration says is one) is skipped by its values."""
    import zipfile

    torch.manual_seed(0)
    path = _script(tmp_path, Vad(trainable=True))
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        code = [i for i in archive.infolist() if "/code/" in i.filename and i.filename.endswith(".py")]
    for info in code:
        name_len, extra_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
            int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")  # the local header's
        start = info.header_offset + 30 + name_len + extra_len
        data[start + info.compress_size // 2] ^= 0xFF  # inside the (deflated) code: no longer its CRC-32
    path.write_bytes(bytes(data))
    skips = _skips(path)
    assert skips["fc.weight"] is None
    assert skips["frontend.basis"] is not None and "windowed DFT basis" in skips["frontend.basis"]
