"""``compare`` and ``describe`` of streamed checkpoints (``stream=True``, ``--stream``), against the
loopback server of tests/remote_server.py as plain URLs and as a fake Hugging Face endpoint: the
same results as for the local files, and for ``describe`` only the headers fetched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import wbfe
from cli.main import app
from tests.remote_server import Repo, Server
from tests.test_remote_stream import make_checkpoint, server  # noqa: F401 - the fixture
from wbfe.errors import InvalidOptionError
from wbfe.sources.http_range import FIRST_READ


def make_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Checkpoint A and a B whose weights are A's plus a seeded perturbation."""
    import torch
    from safetensors.torch import load_file, save_file

    a = make_checkpoint(tmp_path / "a" / "model.safetensors")
    gen = torch.Generator().manual_seed(11)
    tensors = {k: (v.float() + 0.05 * torch.randn(v.shape, generator=gen)).to(v.dtype)
               for k, v in load_file(str(a)).items()}
    b = tmp_path / "b" / "model.safetensors"
    b.parent.mkdir(parents=True)
    save_file(tensors, str(b), metadata={"format": "pt"})
    return a, b


def same_comparison(x: wbfe.Comparison, y: wbfe.Comparison) -> None:
    assert x.layers and x.layers == y.layers
    assert x.skipped == y.skipped and x.unmatched == y.unmatched and x.summary == y.summary


def test_compare_of_a_streamed_url_and_a_streamed_hub_model_equals_compare_of_the_local_files(
        tmp_path: Path, server: Server) -> None:  # noqa: F811 - the imported fixture
    a, b = make_pair(tmp_path)
    server.state.files["/a/model.safetensors"] = a.read_bytes()
    server.state.repos["org/b"] = Repo({"model.safetensors": b.read_bytes()}, commit="d" * 40)
    local = wbfe.compare(str(a), str(b), metrics="bfe")
    streamed = wbfe.compare(server.url("/a/model.safetensors"), "org/b", metrics="bfe", stream=True)
    same_comparison(streamed, local)
    assert streamed.model_a["transport"] == "stream" and streamed.model_b["transport"] == "stream"
    assert streamed.model_b["commit"] == "d" * 40
    # Each side's bytes fetched once: a stream, not a download.
    assert sum(r.sent for r in server.state.ranged("/a/model.safetensors")) == a.stat().st_size
    assert sum(r.sent for r in server.state.ranged("/lfs/")) == b.stat().st_size
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("*.safetensors"))


def test_the_cli_compares_streamed_checkpoints_with_stream(tmp_path: Path, server: Server) -> None:  # noqa: F811
    a, b = make_pair(tmp_path)
    server.state.files["/a.safetensors"] = a.read_bytes()
    server.state.files["/b.safetensors"] = b.read_bytes()
    runner = CliRunner()
    got = runner.invoke(app, ["compare", server.url("/a.safetensors"), server.url("/b.safetensors"),
                              "--stream", "--metrics", "bfe", "-f", "json"])
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout)["layers"] == json.loads(wbfe.compare(str(a), str(b), metrics="bfe").to_json())["layers"]
    refused = runner.invoke(app, ["compare", str(a), str(b), "--stream"])
    assert refused.exit_code == 2 and "--stream reads hub ids" in refused.output
    with pytest.raises(InvalidOptionError, match="stream must be True, False or None"):
        wbfe.compare(str(a), str(b), stream="yes")  # type: ignore[arg-type]


def big_checkpoint(path: Path) -> Path:
    """Tensors far larger than the header's first read: a read of any of them would show in the log."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(3)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"layers.0.weight": torch.randn(512, 384, generator=gen), "layers.1.weight": torch.randn(384, 512, generator=gen),
               "classifier.weight": torch.randn(10, 384, generator=gen)}, str(path), metadata={"format": "pt"})
    return path


def test_describe_streams_only_the_headers(tmp_path: Path, server: Server) -> None:  # noqa: F811
    local = big_checkpoint(tmp_path / "model.safetensors")
    size = local.stat().st_size
    config = {"model_type": "bert", "architectures": ["BertForSequenceClassification"]}
    server.state.repos["org/d"] = Repo({"model.safetensors": local.read_bytes(),
                                        "config.json": json.dumps(config).encode()}, commit="e" * 40)
    server.state.files["/d.safetensors"] = local.read_bytes()
    expected = wbfe.describe(str(local))
    for ref, where in (("org/d", "/lfs/"), (server.url("/d.safetensors"), "/d.safetensors")):
        before = len(server.state.log)
        got = wbfe.describe(ref, stream=True)
        assert got.matrices == expected.matrices and got.skipped == expected.skipped
        assert got.head == expected.head == "classifier.weight"
        reads = [r for r in server.state.log[before:] if where in r.path]
        # One read of the header's first bytes; no tensor past it is fetched.
        assert [r.range for r in reads] == [f"bytes=0-{FIRST_READ - 1}"]
        assert sum(r.sent for r in reads) == FIRST_READ < size / 20
    out = CliRunner().invoke(app, ["describe", "org/d", "--stream", "-f", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["matrices"] == expected.matrices
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("*.safetensors"))
