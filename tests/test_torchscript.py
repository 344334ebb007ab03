"""TorchScript archives (wbfe/sources/torchscript_files.py): every tensor of a scripted or traced
module read from the archive's records equals the module's own, without torch.jit.load; a pickle
that needs code is refused, a damaged archive is a typed error."""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Dict

import pytest
import torch
from torch import nn
from typer.testing import CliRunner
from wbfe_cli.main import app

import wbfe
from wbfe.errors import CorruptCheckpointError, UnsafePickleError
from wbfe.linalg.arrays import to_torch
from wbfe.sources import open_source


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.conv = nn.Conv1d(8, 12, 3)
        self.bn = nn.BatchNorm1d(12)
        self.blocks = nn.ModuleList([nn.Linear(12, 12) for _ in range(2)])
        self.head = nn.Linear(12, 5)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 12))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.conv(self.emb(ids).transpose(1, 2))).mean(2) * self.scale
        for block in self.blocks:
            h = torch.relu(block(h))
        return self.head(h)


@pytest.fixture(scope="module")
def net() -> Net:
    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():  # non-default BatchNorm statistics, so they are read, not assumed
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    return model


def save_scripted(net: nn.Module, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(net), str(path))
    return path


def _traced_entries(module: torch.nn.Module, example: torch.Tensor, path: Path) -> dict[str, torch.Tensor]:
    """Trace ``module`` on ``example``, save it at ``path`` and read every entry back through wbfe's reader."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.trace(module, example), str(path))
    with open_source(path) as source:
        return {e.name: to_torch(e.load()) for e in source.entries()}


def test_every_tensor_equals_the_modules_own(tmp_path: Path, net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_scripted(net, tmp_path / "net.pt")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the archive's code must not be loaded")

    monkeypatch.setattr(torch.jit, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    with open_source(path) as source:
        assert source.provenance.format == "torchscript"
        got = {e.name: to_torch(e.load()) for e in source.entries()}
    want = net.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_scores_exactly_as_the_module(tmp_path: Path, net: Net) -> None:
    path = save_scripted(net, tmp_path / "net.jit")
    got = {row["name"]: row["bfe"] for row in wbfe.score(path, metrics="bfe").layers}
    want = {row["name"]: row["bfe"] for row in wbfe.score(net, metrics="bfe").layers}
    assert got == want and len(got) == 5


def test_traced_constants_are_read(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    captured = torch.randn(3, 4, generator=g)

    class Traced(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) @ captured.T

    torch.manual_seed(2)
    module = Traced()
    got = _traced_entries(module, torch.randn(2, 4), tmp_path / "t.pt")
    assert torch.equal(got["constants.0"], captured)
    assert torch.equal(got["fc.weight"], module.fc.weight.detach())


def _with_data_pkl(path: Path, out: Path, payload: bytes) -> Path:
    """``path`` with its data.pkl replaced by ``payload``."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = payload if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info, data)
    return out


class _Exploit:
    def __reduce__(self) -> tuple:
        import os

        return (os.system, ("touch /tmp/wbfe-torchscript-pwned",))


def test_a_pickle_that_needs_code_is_refused(tmp_path: Path, net: Net) -> None:
    path = save_scripted(net, tmp_path / "net.pt")
    bad = _with_data_pkl(path, tmp_path / "bad.pt", pickle.dumps(_Exploit(), protocol=2))
    with pytest.raises(UnsafePickleError, match=r"needs (posix|os)\.system"):
        open_source(bad)
    assert not Path("/tmp/wbfe-torchscript-pwned").exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage-pickle", "missing-record", "short-record"])
def test_damaged_archives_get_a_typed_error_and_exit_2(tmp_path: Path, net: Net, damage: str) -> None:
    path = save_scripted(net, tmp_path / "net.pt")
    if damage == "truncated":
        raw = path.read_bytes()
        bad = tmp_path / "bad.jit"
        bad.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage-pickle":
        bad = _with_data_pkl(path, tmp_path / "bad.jit", b"\x80\x02(garbage")
    else:
        bad = tmp_path / "bad.jit"
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
            for info in src.infolist():
                data = src.read(info)
                if info.filename.endswith("/data/1"):
                    if damage == "missing-record":
                        continue
                    data = data[:-4]
                dst.writestr(info, data)
    with pytest.raises(CorruptCheckpointError) as info:
        with open_source(bad) as source:
            for entry in source.entries():
                entry.load()
    assert str(bad) in str(info.value)
    result = CliRunner().invoke(app, ["score", str(bad), "--metrics", "bfe"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_sniffed_from_a_pt_name_and_picked_in_a_folder(tmp_path: Path, net: Net) -> None:
    save_scripted(net, tmp_path / "model.pt")
    (tmp_path / "config.json").write_text('{"num_labels": 5}')
    with open_source(tmp_path) as source:
        assert source.provenance.format == "torchscript" and source.config == {"num_labels": 5}


class _Keyed(nn.Module):
    def __init__(self, keys: list[str]) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.table = torch.jit.Attribute({k: torch.randn(6, 8, generator=g) for k in keys}, Dict[str, torch.Tensor])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_dict_keys_that_end_in_a_dot_keep_their_names(tmp_path: Path) -> None:
    """Names are joined as a state dict joins them: keys "x", "x." and "" of a dict attribute are table.x, table.x.
    and table. ("x." and "x" were both named table.x, two rows of one name; "" was named table)."""
    module = _Keyed(["x", "x.", "", "a.."])
    path = save_scripted(module, tmp_path / "keyed.pt")
    with open_source(path) as source:
        got = {e.name: to_torch(e.load()) for e in source.entries()}
    assert list(got) == ["table.x", "table.x.", "table.", "table.a.."]
    for key, tensor in module.table.value.items():
        assert torch.equal(got[f"table.{key}"], tensor), key
    assert sorted(r["name"] for r in wbfe.score(path, metrics="bfe").layers) == sorted(got)


def test_a_code_constant_named_like_a_module_tensor_is_qualified_by_its_place(tmp_path: Path) -> None:
    """A traced module whose attribute ``constants`` is a ParameterList names its first parameter constants.0, as the
    code's first constant is named: the module's tensor keeps the name, the constant is qualified by its place (as
    TFLite's reader qualifies a repeated name) and both are scored. Both were scored under one name, two rows, and an
    edit, which goes by name, took one for the other."""
    g = torch.Generator().manual_seed(4)
    captured = torch.randn(6, 6, generator=g)

    class Clash(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.constants = nn.ParameterList([nn.Parameter(torch.randn(6, 8, generator=g))])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x @ self.constants[0].T) @ captured

    module = Clash()
    got = _traced_entries(module, torch.randn(2, 8), tmp_path / "clash.pt")
    assert list(got) == ["constants.0", "constants.0#1"]
    assert torch.equal(got["constants.0"], module.constants[0].detach()) and torch.equal(got["constants.0#1"], captured)
    result = wbfe.score(tmp_path / "clash.pt", metrics="bfe")
    want = wbfe.score({"constants.0": module.constants[0].detach(), "constants.0#1": captured}, metrics="bfe").layers
    assert [(r["name"], r["bfe"]) for r in result.layers] == [(r["name"], r["bfe"]) for r in want]
