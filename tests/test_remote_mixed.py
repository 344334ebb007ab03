"""Remote references as docs/remote.md and docs/scoring.md describe them (issue #44 §5), against the
loopback server of tests/remote_server.py: an index URL downloaded with its shards, a folder URL
refused before anything is cached, ``--stream`` with one local side, and errors that name what the
user named, never wbfe's cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import wbfe
from tests.ray_zoo import make_sharded
from tests.remote_server import Repo, Server
from tests.test_remote_stream import make_checkpoint, same_scores
from tests.test_remote_stream import server  # noqa: F401 - the loopback server and hub fixture
from wbfe.errors import CorruptCheckpointError, InvalidOptionError, SourceNotFoundError
from wbfe.sources import TensorEntry, TensorSource, remote
from wbfe.sources.resay import resaying
from wbfe_cli.main import app


def _cached(tmp_path: Path) -> list[Path]:
    """Everything in wbfe's object cache (the server fixture points $WBFE_CACHE_DIR into tmp_path)."""
    objects = tmp_path / "wbfe-cache" / "objects"
    return sorted(objects.rglob("*")) if objects.exists() else []


def _serve_folder(srv: Server, folder: Path, where: str) -> None:
    for path in folder.iterdir():
        srv.state.files[f"{where}/{path.name}"] = path.read_bytes()


@pytest.mark.parametrize("ignore_range", [False, True], ids=["ranges", "no-ranges"])
@pytest.mark.parametrize("stream", [None, False], ids=["default", "no-stream"])
def test_an_index_url_is_downloaded_with_its_shards(tmp_path: Path, server: Server,  # noqa: F811
                                                    monkeypatch: pytest.MonkeyPatch, ignore_range: bool,
                                                    stream: bool | None) -> None:
    folder = make_sharded(tmp_path / "sharded")
    _serve_folder(server, folder, "/m")
    server.state.ignore_range = ignore_range
    monkeypatch.setattr(remote, "free_disk", lambda folder: 10**15)  # the default then downloads
    url = server.url("/m/model.safetensors.index.json")

    downloaded = wbfe.score(url, stream=stream, metrics="bfe")

    # As the local index named alone (a URL brings no config.json, docs/remote.md).
    same_scores(downloaded, wbfe.score(str(folder / "model.safetensors.index.json"), metrics="bfe"))
    assert downloaded.model["source"] == url and "transport" not in downloaded.model
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(shards) == 3
    assert sorted(p.name for p in _cached(tmp_path) if p.suffix == ".safetensors") == shards
    for shard in shards:  # each shard fetched whole, as a plain download
        assert any(r.path == f"/m/{shard}" and r.status == 200 and r.sent == (folder / shard).stat().st_size
                   for r in server.state.log)
    # A second score reads the copy: with --no-stream, no shard body is fetched again (by default
    # the streaming probe reads each shard's first bytes before deciding to download).
    sent = sum(r.sent for r in server.state.log)
    again = wbfe.score(url, stream=stream, metrics="bfe")
    same_scores(again, downloaded)
    if stream is False:
        assert sum(r.sent for r in server.state.log) - sent <= (folder / "model.safetensors.index.json").stat().st_size


def test_an_index_url_whose_shard_changed_is_fetched_again(tmp_path: Path, server: Server) -> None:  # noqa: F811
    folder = make_sharded(tmp_path / "sharded")
    _serve_folder(server, folder, "/m")
    url = server.url("/m/model.safetensors.index.json")
    first = wbfe.score(url, stream=False, metrics="bfe")
    # A retrained model of the same layout: the index is unchanged, one shard's values are not.
    shard = "model-00002-of-00003.safetensors"
    changed = load_file(str(folder / shard))
    changed["model.layers.2.mlp.up_proj.weight"] = torch.eye(80, 40) * 3
    save_file(changed, str(folder / shard), metadata={"format": "pt"})
    server.state.files[f"/m/{shard}"] = (folder / shard).read_bytes()
    second = wbfe.score(url, stream=False, metrics="bfe")
    same_scores(second, wbfe.score(str(folder / "model.safetensors.index.json"), metrics="bfe"))
    assert second.layers != first.layers


def test_an_index_url_with_a_missing_shard_names_the_shard_url(tmp_path: Path, server: Server) -> None:  # noqa: F811
    folder = make_sharded(tmp_path / "sharded")
    _serve_folder(server, folder, "/m")
    del server.state.files["/m/model-00003-of-00003.safetensors"]
    url = server.url("/m/model.safetensors.index.json")
    with pytest.raises(SourceNotFoundError) as caught:
        wbfe.score(url, stream=False)
    assert str(caught.value) == (f"{url}: shard 'model-00003-of-00003.safetensors' listed in the index is missing "
                                 f"from the store (no {server.url('/m/model-00003-of-00003.safetensors')})")
    assert not [p for p in _cached(tmp_path) if p.is_file()]


@pytest.mark.parametrize("stream", [None, True, False])
def test_a_folder_url_is_refused_before_anything_is_cached(tmp_path: Path, server: Server,  # noqa: F811
                                                          stream: bool | None) -> None:
    folder = make_sharded(tmp_path / "sharded")
    _serve_folder(server, folder, "/llama")
    server.state.files["/llama/"] = b"<html><a href='model.safetensors.index.json'>index</a></html>"
    url = server.url("/llama/")
    with pytest.raises(SourceNotFoundError, match=r"/llama/: a URL of a folder; name a checkpoint file or a shard "
                                                  r"index in it"):
        wbfe.score(url, stream=stream)
    assert _cached(tmp_path) == [] and server.state.log == []  # not even asked


def test_a_web_page_is_refused_before_anything_is_cached(tmp_path: Path, server: Server) -> None:  # noqa: F811
    server.state.files["/llama"] = b"<html>a listing</html>"
    server.state.types["/llama"] = "text/html; charset=utf-8"
    result = CliRunner().invoke(app, ["score", server.url("/llama")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"wbfe: error: {server.url('/llama')}: the server answers with a web page, not a checkpoint; name a checkpoint "
        "file or a shard index in it, e.g. .../model.safetensors or .../model.safetensors.index.json"]
    assert not [p for p in _cached(tmp_path) if p.is_file()]


def _ranged(srv: Server, path: str) -> int:
    return sum(1 for r in srv.state.log if r.path == path and r.status == 206)


def test_compare_streams_the_remote_side_and_reads_the_local_one(tmp_path: Path, server: Server) -> None:  # noqa: F811
    remote_file = make_checkpoint(tmp_path / "remote" / "model.safetensors")
    server.state.files["/m.safetensors"] = remote_file.read_bytes()
    local = tmp_path / "local" / "model.safetensors"
    local.parent.mkdir()
    save_file({k: v.clone() * 1.5 for k, v in load_file(str(remote_file)).items()}, str(local))
    url = server.url("/m.safetensors")
    for a, b in ((url, str(local)), (str(local), url)):
        got = wbfe.compare(a, b, stream=True, metrics="bfe")
        expected = wbfe.compare(*(str(remote_file) if ref == url else ref for ref in (a, b)), metrics="bfe")
        streamed = got.model_a if a == url else got.model_b
        assert streamed["transport"] == "stream" and streamed["source"] == url
        assert [row["name"] for row in got.layers] == [row["name"] for row in expected.layers]
        for row, want in zip(got.layers, expected.layers):
            assert {k: v for k, v in row.items() if k != "name"} == {k: v for k, v in want.items() if k != "name"}
    assert _ranged(server, "/m.safetensors") > 2 and _cached(tmp_path) == []  # streamed: ranges, nothing cached
    with pytest.raises(InvalidOptionError, match="--stream reads hub ids"):  # two local sides: still refused
        wbfe.compare(str(remote_file), str(local), stream=True)
    cli = CliRunner().invoke(app, ["compare", url, str(local), "--stream", "--metrics", "bfe", "-f", "json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["model_a"]["transport"] == "stream"


def _adapter(folder: Path, base: dict[str, torch.Tensor]) -> Path:
    gen = torch.Generator().manual_seed(3)
    tensors = {}
    for name in ("layers.0", "layers.1"):
        m, n = base[f"{name}.weight"].shape
        tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(4, n, generator=gen)
        tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(m, 4, generator=gen)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    return folder


def test_a_local_adapter_streams_its_hub_base(tmp_path: Path, server: Server) -> None:  # noqa: F811
    base_file = make_checkpoint(tmp_path / "base" / "model.safetensors")
    base = {k: v.float() for k, v in load_file(str(base_file)).items()}
    save_file(base, str(base_file))
    server.state.repos["org/base"] = Repo({"model.safetensors": base_file.read_bytes()}, commit="b" * 40)
    adapter = _adapter(tmp_path / "adapter", base)

    streamed = wbfe.score(adapter, base="org/base", stream=True, metrics="bfe")
    local = wbfe.score(adapter, base=str(base_file), metrics="bfe")

    assert streamed.model["base"]["transport"] == "stream" and streamed.model["base"]["source"] == "org/base"
    assert streamed.layers == local.layers and streamed.summary == local.summary
    assert {row["name"] for row in streamed.layers} == {"layers.0.weight", "layers.1.weight"}
    assert all(row["bfe_merged"] is not None for row in streamed.layers)
    assert any(r.status == 206 for r in server.state.log)  # the base's tensors came by range
    assert not (tmp_path / "hf").exists() or not list((tmp_path / "hf").rglob("*.safetensors"))  # nothing downloaded
    cli = CliRunner().invoke(app, ["score", str(adapter), "--base", "org/base", "--stream", "--metrics", "bfe",
                                   "-f", "json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["model"]["base"]["transport"] == "stream"
    with pytest.raises(InvalidOptionError, match="--stream reads hub ids"):  # both local: still refused
        wbfe.score(adapter, base=str(base_file), stream=True)


def _corrupt_safetensors() -> bytes:
    header = b'{"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}'
    return len(header).to_bytes(8, "little") + header + bytes(10)  # 54 bytes short


def test_an_error_in_a_downloaded_url_names_the_url_not_the_cache(tmp_path: Path, server: Server) -> None:  # noqa: F811
    server.state.files["/m/model.safetensors"] = _corrupt_safetensors()
    url = server.url("/m/model.safetensors")
    with pytest.raises(CorruptCheckpointError) as caught:
        wbfe.score(url, stream=False)
    message = str(caught.value)
    assert message.startswith(f"{url}: ") and "wbfe-cache" not in message, message
    assert caught.value.path == url  # type: ignore[attr-defined]
    cli = CliRunner().invoke(app, ["score", url, "--no-stream"])
    assert cli.exit_code == 2 and cli.output.startswith(f"wbfe: error: {url}: ") and "wbfe-cache" not in cli.output


def test_an_error_in_a_downloaded_hub_model_names_the_hub_id(tmp_path: Path, server: Server) -> None:  # noqa: F811
    server.state.repos["org/broken"] = Repo({"model.safetensors": _corrupt_safetensors(), "config.json": b"{}"})
    with pytest.raises(CorruptCheckpointError) as caught:
        wbfe.score("org/broken", stream=False)
    message = str(caught.value)
    assert message.startswith("org/broken/model.safetensors: "), message
    assert str(tmp_path / "hf") not in message
    # Once cached, the same error is said the same way (read from the cache, not downloaded).
    with pytest.raises(CorruptCheckpointError, match="^org/broken/model.safetensors: "):
        wbfe.score("org/broken", stream=False)


class _Failing(TensorSource):
    """A copy whose second tensor fails to read, naming the copy's file as a reader does."""

    def __init__(self, copy: Path):
        self.copy = copy

    def entries(self) -> Iterator[TensorEntry]:
        def fail() -> Any:
            raise CorruptCheckpointError(f"{self.copy}/model.bin: tensor 'b' is truncated", path=str(self.copy / "model.bin"))

        yield TensorEntry("a", (2, 2), "float32", load=lambda: torch.zeros(2, 2))
        yield TensorEntry("b", (2, 2), "float32", load=fail)
        raise CorruptCheckpointError(f"{self.copy}/model.bin: ends inside the tensor list")


def test_errors_while_a_copy_is_read_are_said_of_the_reference(tmp_path: Path) -> None:
    copy = tmp_path / "objects" / "ab" / "abcdef"
    source = resaying(_Failing(copy), copy, "s3://bucket/llama/")
    assert isinstance(source, _Failing)  # the same object: what callers know of its class holds
    entries = source.entries()
    first = next(entries)
    assert first.load().shape == (2, 2)
    second = next(entries)
    with pytest.raises(CorruptCheckpointError) as caught:
        second.load()
    assert str(caught.value) == "s3://bucket/llama/model.bin: tensor 'b' is truncated"
    assert caught.value.path == "s3://bucket/llama/model.bin"  # type: ignore[attr-defined]
    with pytest.raises(CorruptCheckpointError, match=r"^s3://bucket/llama/model.bin: ends inside the tensor list$"):
        next(entries)
