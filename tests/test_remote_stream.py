"""Streaming remote safetensors with HTTP range requests (wbfe.sources.remote), against a loopback
server in the test: plain URLs and a fake Hugging Face endpoint (HF_ENDPOINT) whose model-info and
resolve routes the real huggingface_hub client and wbfe's range reader both call.

Every streamed score is compared with the score of the same bytes read from a local file: equal
rows, skips and summaries, not merely close ones."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any, Iterator

import pytest

import wbfe
from tests.ray_zoo import make_sharded
from tests.remote_server import Repo, Server, isolated_hub
from wbfe.errors import (
    CorruptCheckpointError,
    InvalidOptionError,
    ModelNotFoundError,
    RangeNotSupportedError,
    RemoteReadError,
    SourceNotFoundError,
)
from wbfe.linalg.arrays import to_torch
from wbfe.sources import http_range, open_source, remote
from wbfe.sources.http_range import FIRST_READ, RetryPolicy


@pytest.fixture()
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """A running loopback server as the hub (HF_ENDPOINT), empty caches, quick retries."""
    isolated_hub(monkeypatch, tmp_path)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(http_range, "DEFAULT_POLICY", RetryPolicy(attempts=3, backoff=0.001, backoff_max=0.01,
                                                                  timeout=5.0))
    with Server() as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.endpoint)
        yield srv


def make_checkpoint(path: Path) -> Path:
    """Tensors larger than the first read (so each is its own request), a bias, a small head."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(7)
    tensors = {"layers.0.weight": torch.randn(256, 192, generator=gen) / 14,
               "layers.0.bias": torch.randn(256, generator=gen),
               "layers.1.weight": (torch.randn(128, 256, generator=gen) / 16).to(torch.bfloat16),
               "head.weight": torch.randn(10, 128, generator=gen) / 11}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def spans(data: bytes) -> dict[str, tuple[int, int]]:
    """Each tensor's byte span [first, last] in the file, from the header read here independently."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {name: (8 + n + info["data_offsets"][0], 8 + n + info["data_offsets"][1] - 1)
            for name, info in header.items()}


def same_scores(a: Any, b: Any) -> None:
    assert a.layers == b.layers
    assert a.skipped == b.skipped
    assert a.summary == b.summary


def test_a_streamed_url_scores_as_the_local_file_with_one_request_a_tensor(tmp_path: Path, server: Server) -> None:
    local = make_checkpoint(tmp_path / "m.safetensors")
    data = local.read_bytes()
    server.state.files["/models/m.safetensors"] = data
    url = server.url("/models/m.safetensors")
    streamed = wbfe.score(url, stream=True)
    same_scores(streamed, wbfe.score(str(local)))
    assert streamed.model["transport"] == "stream" and streamed.model["files"] == [url]
    log = server.state.ranged("/models/m.safetensors")
    # The header in one request of FIRST_READ bytes, then one request per tensor past it, each
    # asking for exactly the tensor's bytes not read yet; nothing else: the bodies add up to the file.
    assert log[0].range == f"bytes=0-{FIRST_READ - 1}"
    expected = sorted(f"bytes={max(a, FIRST_READ)}-{b}" for a, b in spans(data).values() if b >= FIRST_READ)
    assert sorted(r.range for r in log[1:]) == expected
    assert all(r.status == 206 for r in log)
    assert sum(r.sent for r in log) == len(data)
    assert not (tmp_path / "wbfe-cache").exists()  # nothing written to disk


def assert_streams_the_files_bytes(ref: str, local: Path) -> None:
    """Streaming ``ref`` (the bytes of ``local``) gives the tensors the safetensors package reads
    from ``local``, in the order a local read lists them, in one request per tensor beyond the
    header's read and no byte fetched twice."""
    from safetensors.torch import load_file

    reference = load_file(str(local))
    with open_source(ref, stream=True) as source:
        loaded = {entry.name: to_torch(entry.load()) for entry in source.entries()}
        fetched = source.fetched()  # type: ignore[attr-defined]
    with open_source(str(local)) as source:
        assert list(loaded) == [entry.name for entry in source.entries()]  # the same order as read locally
    for name, tensor in reference.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].equal(tensor)
    assert fetched == {"requests": 3, "bytes": local.stat().st_size, "size": local.stat().st_size}


def test_streamed_tensors_hold_the_files_bytes(tmp_path: Path, server: Server) -> None:
    local = make_checkpoint(tmp_path / "m.safetensors")
    server.state.files["/m.safetensors"] = local.read_bytes()
    assert_streams_the_files_bytes(server.url("/m.safetensors"), local)


def test_a_hub_model_streams_through_the_model_info_and_resolve_routes(tmp_path: Path, server: Server) -> None:
    folder = make_sharded(tmp_path / "sharded")
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    config = {"model_type": "llama", "tie_word_embeddings": False}
    files["config.json"] = json.dumps(config).encode()
    repo = server.state.repos["org/tiny"] = Repo(files, commit="c" * 40)
    streamed = wbfe.score("org/tiny", stream=True)
    local = wbfe.score(str(folder))
    same_scores(streamed, local)
    # The hub lists each LFS file's SHA-256: the checkpoint's digest is the local files' digest.
    assert streamed.model["sha256"] == local.model["sha256"]
    assert streamed.model["commit"] == repo.commit and streamed.model["format"] == "hf-hub"
    paths = [r.path for r in server.state.log]
    assert "/api/models/org/tiny" in paths
    resolved = [p for p in paths if "/resolve/" in p]
    # Every file at the commit the model-info named, never at "main"; the weights redirected to LFS.
    assert resolved and all(f"/resolve/{repo.commit}/" in p for p in resolved)
    assert any(p.startswith("/lfs/") for p in paths)
    assert f"/org/tiny/resolve/{repo.commit}/config.json" in paths
    with open_source("org/tiny", stream=True) as source:
        assert source.config == config
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("*.safetensors"))


def test_a_pinned_revision_is_read_at_that_commit(tmp_path: Path, server: Server) -> None:
    local = make_checkpoint(tmp_path / "model.safetensors")
    commit = "0123456789abcdef0123456789abcdef01234567"
    server.state.repos["org/pinned"] = Repo({"model.safetensors": local.read_bytes()}, commit=commit)
    streamed = wbfe.score(f"org/pinned@{commit}", stream=True)
    same_scores(streamed, wbfe.score(str(local)))
    assert streamed.model["revision"] == commit and streamed.model["commit"] == commit
    assert f"/api/models/org/pinned/revision/{commit}" in [r.path for r in server.state.log]
    with pytest.raises(ModelNotFoundError, match="no such revision"):
        wbfe.score("org/pinned@v9", stream=True)


def test_missing_files_and_models_are_one_line_errors(tmp_path: Path, server: Server) -> None:
    with pytest.raises(RemoteReadError, match=r"/nope\.safetensors: not found \(HTTP 404\)") as info:
        wbfe.score(server.url("/nope.safetensors"), stream=True)
    assert isinstance(info.value, SourceNotFoundError) and "\n" not in str(info.value)
    assert len(server.state.ranged("/nope")) == 1  # a 404 is not retried
    with pytest.raises(ModelNotFoundError, match="no such model"):
        wbfe.score("org/absent", stream=True)


def test_a_401_says_a_token_is_needed_and_the_token_is_sent(tmp_path: Path, server: Server,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    local = make_checkpoint(tmp_path / "model.safetensors")
    server.state.repos["org/gated"] = Repo({"model.safetensors": local.read_bytes()})
    server.state.token = "hf_secret"
    with pytest.raises(RemoteReadError, match=r"model\.safetensors: access refused \(HTTP 401\).*HF_TOKEN"):
        wbfe.score("org/gated", stream=True)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    server.state.log.clear()
    same_scores(wbfe.score("org/gated", stream=True), wbfe.score(str(local)))
    # The token goes to the hub, never to the storage host its redirects lead to.
    assert {r.auth for r in server.state.log if "/resolve/" in r.path} == {"Bearer hf_secret"}
    assert {r.auth for r in server.state.log if r.path.startswith("/lfs/")} == {None}


def test_a_url_refused_access_does_not_say_to_set_a_token_that_is_never_sent(tmp_path: Path, server: Server,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain URL is read without credentials, so a 401/403 says so, and how to name a hub model or a bucket instead;
    it said to set HF_TOKEN, which a URL's requests never carry (checked: with it set, none is sent)."""
    server.state.files["/m.safetensors"] = make_checkpoint(tmp_path / "m.safetensors").read_bytes()
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    for status in (401, 403):
        server.state.faults.append(("/m.safetensors", f"status:{status}"))
        with pytest.raises(RemoteReadError, match=rf"^{re.escape(server.url('/m.safetensors'))}: access refused \(HTTP "
                           rf"{status}\); wbfe sends no credentials with a URL: name a hub model as org/name"):
            wbfe.score(server.url("/m.safetensors"), stream=True)
    assert {r.auth for r in server.state.log} == {None}


def test_a_429_is_retried(tmp_path: Path, server: Server) -> None:
    local = make_checkpoint(tmp_path / "model.safetensors")
    server.state.files["/m.safetensors"] = local.read_bytes()
    server.state.faults.append(("/m.safetensors", "status:429"))
    same_scores(wbfe.score(server.url("/m.safetensors"), stream=True), wbfe.score(str(local)))
    assert [r.status for r in server.state.ranged("/m.safetensors")[:2]] == [429, 206]


def test_a_server_that_ignores_range_is_refused_when_streaming_and_downloaded_by_default(
        tmp_path: Path, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    local = make_checkpoint(tmp_path / "model.safetensors")
    data = local.read_bytes()
    server.state.files["/m.safetensors"] = data
    server.state.ignore_range = True
    with pytest.raises(RangeNotSupportedError, match="ignores HTTP range requests.*with --no-stream"):
        wbfe.score(server.url("/m.safetensors"), stream=True)
    assert len(server.state.ranged("/m.safetensors")) == 1  # refused at the first answer, not retried
    monkeypatch.setattr(remote, "free_disk", lambda folder: 10**15)
    downloaded = wbfe.score(server.url("/m.safetensors"))
    same_scores(downloaded, wbfe.score(str(local)))
    assert "transport" not in downloaded.model
    assert list((tmp_path / "wbfe-cache" / "objects").rglob("m.safetensors"))


def test_by_default_a_file_larger_than_the_free_disk_is_streamed(tmp_path: Path, server: Server,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    local = make_checkpoint(tmp_path / "model.safetensors")
    size = local.stat().st_size
    server.state.files["/m.safetensors"] = local.read_bytes()
    asked: list[Path] = []

    def free(folder: Path, left: int) -> int:
        asked.append(folder)
        return left

    monkeypatch.setattr(remote, "free_disk", lambda folder: free(folder, size - 1))
    streamed = wbfe.score(server.url("/m.safetensors"))
    assert streamed.model["transport"] == "stream"
    assert asked == [tmp_path / "wbfe-cache" / "objects"]
    assert not (tmp_path / "wbfe-cache").exists()
    from wbfe.sources import content_hash

    with pytest.raises(SourceNotFoundError, match="lists no SHA-256 has no content hash; score it with --no-stream"):
        content_hash(server.url("/m.safetensors"))  # a URL's bytes are never hashed when streamed
    monkeypatch.setattr(remote, "free_disk", lambda folder: free(folder, size))
    copied = wbfe.score(server.url("/m.safetensors"))
    assert "transport" not in copied.model
    same_scores(streamed, copied)
    # --no-stream never asks.
    asked.clear()
    wbfe.score(server.url("/m.safetensors"), stream=False)
    assert asked == []


def test_by_default_a_hub_model_larger_than_the_free_disk_is_streamed(tmp_path: Path, server: Server,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = make_sharded(tmp_path / "sharded")
    server.state.repos["org/big"] = Repo({p.name: p.read_bytes() for p in folder.iterdir()})
    total = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    asked: list[Path] = []
    monkeypatch.setattr(remote, "free_disk", lambda f: asked.append(f) or total - 1)
    streamed = wbfe.score("org/big")
    assert streamed.model["transport"] == "stream" and asked == [tmp_path / "hf"]
    # Only the index was fetched before the decision; no shard was downloaded into the cache.
    assert not any((tmp_path / "hf").rglob("*.safetensors")) if (tmp_path / "hf").exists() else True
    same_scores(streamed, wbfe.score(str(folder)))
    # With room on the disk it is downloaded into the hub cache, as before.
    monkeypatch.setattr(remote, "free_disk", lambda f: total)
    downloaded = wbfe.score("org/big")
    assert "transport" not in downloaded.model
    assert sorted(p.name for p in (tmp_path / "hf").rglob("*.safetensors")) == sorted(
        p.name for p in folder.glob("*.safetensors"))
    same_scores(downloaded, streamed)


def test_stream_is_refused_for_references_it_cannot_read(tmp_path: Path, server: Server) -> None:
    local = make_checkpoint(tmp_path / "model.safetensors")
    with pytest.raises(InvalidOptionError, match="--stream reads hub ids and http"):
        wbfe.score(str(local), stream=True)
    server.state.files["/m.pt"] = b"not read"
    with pytest.raises(InvalidOptionError, match="--stream reads .safetensors files"):
        wbfe.score(server.url("/m.pt"), stream=True)
    with pytest.raises(InvalidOptionError, match="stream must be True, False or None"):
        wbfe.score(str(local), stream="yes")  # type: ignore[arg-type]


def test_the_cli_streams_with_stream(tmp_path: Path, server: Server) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    local = make_checkpoint(tmp_path / "model.safetensors")
    server.state.files["/m.safetensors"] = local.read_bytes()
    runner = CliRunner()
    streamed = runner.invoke(app, ["score", server.url("/m.safetensors"), "--stream", "-f", "json"])
    assert streamed.exit_code == 0, streamed.output
    assert json.loads(streamed.stdout)["layers"] == json.loads(wbfe.score(str(local)).to_json())["layers"]
    refused = runner.invoke(app, ["score", str(local), "--stream"])
    assert refused.exit_code == 2 and "--stream reads hub ids" in refused.output


@pytest.mark.parametrize("damage", ["header_length", "json", "gap", "truncated"])
def test_a_bad_remote_header_is_refused_with_the_local_files_message(tmp_path: Path, server: Server,
                                                                     damage: str) -> None:
    from wbfe.errors import CorruptCheckpointError

    data = bytearray(make_checkpoint(tmp_path / "m.safetensors").read_bytes())
    if damage == "header_length":
        data[:8] = struct.pack("<Q", 10**12)
    elif damage == "json":
        data[8] = ord("[")
    elif damage == "gap":  # one byte more after the last tensor: the offsets no longer tile the data
        data += b"\0"
    else:
        del data[-100:]
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(bytes(data))
    server.state.files["/bad.safetensors"] = bytes(data)
    with pytest.raises(CorruptCheckpointError) as local_error:
        wbfe.score(str(bad))
    with pytest.raises(CorruptCheckpointError) as remote_error:
        wbfe.score(server.url("/bad.safetensors"), stream=True)
    assert type(remote_error.value) is type(local_error.value)
    assert str(remote_error.value) == str(local_error.value).replace(str(bad), server.url("/bad.safetensors"))
    assert len(server.state.ranged("/bad")) == 1  # the header's request only


def test_stream_is_refused_for_a_hub_model_without_safetensors(tmp_path: Path, server: Server) -> None:
    server.state.repos["org/pickled"] = Repo({"pytorch_model.bin": b"not read"})
    with pytest.raises(InvalidOptionError, match="org/pickled: --stream reads safetensors weights; this repository "
                                                 "holds pytorch_model.bin"):
        wbfe.score("org/pickled", stream=True)


def _refs(server: Server, data: bytes) -> dict[str, tuple[str, str]]:
    """The same file as a plain URL and as a hub model: ref -> (its range reads' path, its cache)."""
    server.state.files["/m.safetensors"] = data
    server.state.repos["org/r"] = Repo({"model.safetensors": data}, commit="f" * 40)
    return {"url": (server.url("/m.safetensors"), "/m.safetensors"), "hub": ("org/r", "/lfs/")}


@pytest.mark.parametrize("kind", ["url", "hub"])
def test_a_429_with_retry_after_is_retried_after_the_wait_it_names(tmp_path: Path, server: Server, kind: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    local = make_checkpoint(tmp_path / "model.safetensors")
    ref, where = _refs(server, local.read_bytes())[kind]
    waits: list[float] = []
    delay = RetryPolicy.delay

    def recorded(self: RetryPolicy, retry: int, retry_after: float | None = None) -> float:
        waits.append(delay(self, retry, retry_after))
        return waits[-1]

    monkeypatch.setattr(RetryPolicy, "delay", recorded)
    server.state.faults.append((where, "status:429:1"))  # on the weights' range reads (the hub's storage)
    same_scores(wbfe.score(ref, stream=True), wbfe.score(str(local)))
    assert [r.status for r in server.state.ranged(where)[:2]] == [429, 206]
    assert waits == [1.0]  # the Retry-After, not the policy's back-off of 0.001 s


@pytest.mark.parametrize("kind", ["url", "hub"])
def test_a_server_that_ignores_range_does_the_same_on_the_hub_and_plain_urls(tmp_path: Path, server: Server,
                                                                           kind: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    local = make_checkpoint(tmp_path / "model.safetensors")
    ref, where = _refs(server, local.read_bytes())[kind]
    server.state.ignore_range = True
    with pytest.raises(RangeNotSupportedError, match="ignores HTTP range requests.*with --no-stream"):
        wbfe.score(ref, stream=True)
    assert [r.status for r in server.state.ranged(where)] == [200]  # refused at the first answer, not retried
    # By default, where the free disk would have it streamed, the file is downloaded instead.
    monkeypatch.setattr(remote, "free_disk", lambda folder: 0)
    downloaded = wbfe.score(ref)
    same_scores(downloaded, wbfe.score(str(local)))
    assert "transport" not in downloaded.model
    cache = tmp_path / ("wbfe-cache" if kind == "url" else "hf")
    assert [p.read_bytes() for p in cache.rglob("*.safetensors")] == [local.read_bytes()]


@pytest.mark.parametrize("stream", [True, False])
def test_a_repo_or_store_folder_of_several_weight_files_without_an_index_is_named(tmp_path: Path, server: Server,
                                                                                  stream: Any) -> None:
    """Two shards and no index, or one shard of two alone, in a hub repo or a store folder: the one-line refusal
    names the repo or the URI (it named neither: in a zoo of many the user could not tell which was meant), and
    nothing is fetched."""
    fsspec = pytest.importorskip("fsspec")
    data = make_checkpoint(tmp_path / "m.safetensors").read_bytes()
    store = fsspec.filesystem("memory")
    cases = {"two": {"model-00001-of-00002.safetensors": data, "model-00002-of-00002.safetensors": data},
             "lone": {"model-00002-of-00002.safetensors": data, "config.json": b"{}"}}
    for case, files in cases.items():
        server.state.repos[f"org/{case}"] = Repo(files)
        for name, body in files.items():
            store.pipe_file(f"/w13noindex/{case}/{name}", body)
        why = ("several safetensors weight files and no single index" if case == "two" else
               r"model-00002-of-00002.safetensors is shard 2 of 2 and no shard index is beside it")
        for ref in (f"org/{case}", f"memory://w13noindex/{case}/"):
            with pytest.raises(CorruptCheckpointError, match=rf"^{re.escape(ref)}: {why}"):
                wbfe.score(ref, stream=stream)
    assert not server.state.ranged(".safetensors") and not list(tmp_path.rglob("objects/*/*"))


@pytest.mark.parametrize("stream", [False, None])
def test_a_repo_without_weights_is_refused_before_anything_is_fetched(tmp_path: Path, server: Server,
                                                                       stream: Any) -> None:
    # A PEFT-looking repo with no weights: its adapter_config.json was downloaded before the refusal, and the
    # next run found that lone file in the hub cache and named the cache path instead of the repo.
    server.state.repos["org/adapterless"] = Repo({"adapter_config.json": b"{}", "README.md": b"no weights"})
    messages = []
    for _ in range(2):
        with pytest.raises(ModelNotFoundError, match=r"^org/adapterless: .*the repository holds no weight files$") as e:
            wbfe.score("org/adapterless", stream=stream)
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert not server.state.ranged("adapter_config.json")
    assert not list((tmp_path / "hf").rglob("adapter_config.json")) if (tmp_path / "hf").exists() else True
