"""A sharded checkpoint streamed from the loopback hub whose shard holds a tensor its index does
not list (issue #33 §7): the tensor is a skipped row with the reason, as when read locally."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest

import wbfe
from tests.ray_zoo import make_sharded
from tests.remote_server import Repo, Server
from wbfe.errors import ModelNotFoundError
from tests.test_remote_stream import server  # noqa: F401 - the loopback hub fixture


def test_a_streamed_shard_tensor_the_index_does_not_list_is_skipped_with_the_reason(
        tmp_path: Path, server: Server) -> None:  # noqa: F811 - the imported fixture
    folder = make_sharded(tmp_path / "sharded")
    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    dropped = "model.layers.3.mlp.up_proj.weight"  # a matrix of the second shard, scored when listed
    assert weight_map.pop(dropped) == "model-00002-of-00003.safetensors"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    files["config.json"] = json.dumps({"model_type": "llama", "tie_word_embeddings": False}).encode()
    server.state.repos["org/unlisted"] = Repo(files, commit="d" * 40)

    streamed = wbfe.score("org/unlisted", stream=True, metrics="bfe")
    local = wbfe.score(str(folder), metrics="bfe")
    assert any("/lfs/" in r.path or "/resolve/" in r.path for r in server.state.log)  # it was remote
    reasons = {s["name"]: s["reason"] for s in streamed.skipped}
    assert "not listed in model.safetensors.index.json" in reasons[dropped]
    assert dropped not in {layer["name"] for layer in streamed.layers}
    # The same rows and skips as the local read of the same files.
    assert streamed.skipped == local.skipped
    assert [layer["name"] for layer in streamed.layers] == [layer["name"] for layer in local.layers]


@pytest.mark.parametrize("stream", [True, False])
def test_an_index_url_reads_shards_whose_names_look_like_urls_beside_it(
        tmp_path: Path, server: Server, stream: bool) -> None:  # noqa: F811 - the imported fixture
    """Shard names holding '#', '?' or a scheme-like 'file:' are files beside the index on the same server,
    streamed or downloaded with the same bytes as locally (unquoted, '#' cut the name, '?' made a query,
    'file:' a URL of its own)."""
    folder = make_sharded(tmp_path / "sharded")
    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    renamed = dict(zip(sorted(set(weight_map.values())), ["shard#1.safetensors", "shard?2.safetensors",
                                                          "file:3.safetensors"]))
    for old, new in renamed.items():
        (folder / old).rename(folder / new)
    index.write_text(json.dumps({"weight_map": {tensor: renamed[shard] for tensor, shard in weight_map.items()}}))
    for path in folder.iterdir():
        server.state.files[f"/org/{path.name}"] = path.read_bytes()

    streamed = wbfe.score(server.url("/org/model.safetensors.index.json"), stream=stream, metrics="bfe")
    assert {r.path for r in server.state.log} == {f"/org/{name}" for name in [index.name, *renamed.values()]}
    local = wbfe.score(str(folder), metrics="bfe")
    assert streamed.layers == local.layers


def test_streamed_shards_whose_metadata_disagree_keep_each_shards_value(
        tmp_path: Path, server: Server) -> None:  # noqa: F811 - the imported fixture
    """As read locally: a key the shards disagree on maps each shard to its value (the last shard's won)."""
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "notes"
    folder.mkdir()
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for name, tensor, note in zip(names, ("a.weight", "b.weight"), ("one", "two")):
        save_file({tensor: torch.ones(8, 8) * len(note)}, str(folder / name), metadata={"format": "pt", "note": note})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a.weight": names[0], "b.weight": names[1]}}))
    server.state.repos["org/notes"] = Repo({p.name: p.read_bytes() for p in folder.iterdir()}, commit="e" * 40)
    streamed = wbfe.score("org/notes", stream=True, metrics="bfe")
    assert streamed.model["metadata"] == {"format": "pt", "note": {names[0]: "one", names[1]: "two"}}
    assert streamed.model["metadata"] == wbfe.score(str(folder), metrics="bfe").model["metadata"]


@pytest.mark.parametrize("no_sha", [False, True], ids=["sha", "mirror"])
@pytest.mark.parametrize("stream", [False, None, True], ids=["downloaded", "default", "streamed"])
def test_a_push_between_two_reads_of_a_hub_model_mixes_no_commits(
        tmp_path: Path, server: Server, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the imported fixture
        stream: bool | None, no_sha: bool) -> None:
    """A push lands as the first file is read: every file is read at the commit resolved first (the model info's,
    else the one the hub serves the first file from), and the provenance names it. The download read each file
    at main: the index of one commit with the shards (or the config) of the next, a shard missing or a config of
    another commit used unsaid."""
    old, new = make_sharded(tmp_path / "old"), make_sharded(tmp_path / "new", width=24)
    (old / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": False}))
    (new / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": True}))
    files = [{p.name: p.read_bytes() for p in folder.iterdir()} for folder in (old, new)]
    server.state.repos["org/moving"] = Repo(files[0], commit="a" * 40, pushed=Repo(files[1], commit="b" * 40))
    server.state.no_sha = no_sha
    got = wbfe.score("org/moving", stream=stream, metrics="bfe")
    # By default the size probe reads the index at a (the push lands), then the download pins main anew: b.
    commit = "b" * 40 if stream is None else "a" * 40
    assert got.model["commit"] == commit
    resolved = [r.path for r in server.state.log if "/resolve/" in r.path]
    at = f"/org/moving/resolve/{commit}/"
    reads = resolved[next(i for i, p in enumerate(resolved) if p.startswith(at)):]
    assert all(p.startswith(at) for p in reads)  # from the pinning on, every file at that one commit
    assert {p[len(at):] for p in reads} >= {"config.json", "model-00003-of-00003.safetensors"}
    local = wbfe.score(str(new if stream is None else old), metrics="bfe")
    assert (got.layers, got.skipped) == (local.layers, local.skipped)
    if no_sha and stream is False:  # a hub naming no commit in its headers either: refused, nothing downloaded
        monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, **kw: SimpleNamespace(commit_hash=None))
        server.state.repos["org/unpinned"] = Repo(files[0])
        with pytest.raises(ModelNotFoundError, match=r"^org/unpinned: .*; the hub names no commit for it, so its files "
                                                     r"could change between two reads unseen; name a commit: "
                                                     r"org/unpinned@<commit>$"):
            wbfe.score("org/unpinned", stream=False)
        assert not list((tmp_path / "hf").glob("models--org--unpinned/snapshots/*/*"))
    if stream is not True:  # what was downloaded answers org/moving offline, as huggingface_hub's own reads did
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        again = wbfe.score("org/moving", metrics="bfe")
        assert (again.layers, again.model["commit"]) == (got.layers, commit)
