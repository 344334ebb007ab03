"""Models referenced by an object-store URI (fsspec's ``memory://`` and ``file://`` stand in for
``s3://`` and ``gs://``): copied into the local cache, then scored exactly as the local files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from safetensors.torch import save_file

import wbfe
from tests.ray_zoo import make_sharded, make_zoo, without_run_details
from wbfe.errors import MissingDependencyError, SourceNotFoundError
from wbfe.ranking import rank

fsspec = pytest.importorskip("fsspec")


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An empty ``memory://`` store, and a fresh wbfe cache folder."""
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")
    yield fs
    fs.store.clear()


def _upload(fs: Any, local: Path, remote: str) -> None:
    if local.is_dir():
        for f in sorted(local.iterdir()):
            fs.pipe_file(f"{remote}/{f.name}", f.read_bytes())
    else:
        fs.pipe_file(remote, local.read_bytes())


def _scores(result: Any) -> dict[str, Any]:
    out = result.to_dict()
    model = out.pop("model")
    return {**out, "sha256": model["sha256"], "format": model["format"]}


def test_a_checkpoint_in_the_store_scores_exactly_as_the_local_file(tmp_path: Path, store: Any) -> None:
    local = make_zoo(tmp_path / "zoo", 1).parent / "m0.safetensors"
    _upload(store, local, "/bucket/models/m0.safetensors")
    remote = wbfe.score("memory://bucket/models/m0.safetensors")
    assert _scores(remote) == _scores(wbfe.score(local))
    assert remote.model["source"] == "memory://bucket/models/m0.safetensors"
    from wbfe.sources import content_hash

    assert content_hash("memory://bucket/models/m0.safetensors") == content_hash(str(local))
    # The copy is in wbfe's cache folder, under objects/.
    copies = list((tmp_path / "cache" / "objects").rglob("m0.safetensors"))
    assert len(copies) == 1 and copies[0].read_bytes() == local.read_bytes()


def test_a_sharded_folder_in_the_store_scores_exactly_as_the_local_folder(tmp_path: Path, store: Any) -> None:
    folder = make_sharded(tmp_path / "sharded")
    (folder / "config.json").write_text('{"model_type": "llama", "tie_word_embeddings": false}')
    _upload(store, folder, "/bucket/sharded")
    store.pipe_file("/bucket/sharded/notes/secret.bin", b"not named by the URI")  # a subfolder: never read
    store.pipe_file("/bucket/sharded-other/x.safetensors", b"a sibling: never read")
    store.pipe_file("/bucket/sharded/optimizer.pt", b"beside the weights, not one of them: never read")
    remote = wbfe.score("memory://bucket/sharded/")
    assert _scores(remote) == _scores(wbfe.score(folder))
    copied = sorted(p.name for p in (tmp_path / "cache" / "objects").rglob("*") if p.is_file())
    assert copied == sorted(p.name for p in folder.iterdir())


def test_a_changed_object_is_fetched_again_and_an_unchanged_one_is_not(tmp_path: Path, store: Any) -> None:
    zoo = make_zoo(tmp_path / "zoo", 2).parent
    _upload(store, zoo / "m0.safetensors", "/b/m.safetensors")
    first = wbfe.score("memory://b/m.safetensors")
    calls: list[str] = []
    real = type(store).get_file

    def counting(self: Any, rpath: str, lpath: str, **kw: Any) -> Any:
        calls.append(rpath)
        return real(self, rpath, lpath, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(store), "get_file", counting)
        again = wbfe.score("memory://b/m.safetensors")
        assert calls == [] and _scores(again) == _scores(first)
        _upload(store, zoo / "m1.safetensors", "/b/m.safetensors")  # replaced in the store
        changed = wbfe.score("memory://b/m.safetensors")
        assert calls == ["/b/m.safetensors"]
    assert _scores(changed) == _scores(wbfe.score(zoo / "m1.safetensors"))
    assert changed.model["sha256"] != first.model["sha256"]


def test_a_re_uploaded_shard_in_a_subfolder_of_a_store_folder_is_fetched_again(tmp_path: Path, store: Any) -> None:
    """A folder URI whose index lists a shard in a subfolder (``sub/a.safetensors``): the shard is part of the
    checkpoint, so re-uploading it makes a new copy, as it does for a top-level shard or an index URI. Before the
    fix the copy was keyed by the folder's top-level files alone and the old shard was scored again."""
    import json

    store.pipe_file("/f/model.safetensors.index.json", json.dumps({"weight_map": {
        "layers.0.weight": "sub/a.safetensors", "layers.1.weight": "b.safetensors"}}).encode())
    for seed in (0, 1):  # the local folder each upload is: the same index and layout, other values
        folder = tmp_path / f"local{seed}"
        (folder / "sub").mkdir(parents=True)
        (folder / "model.safetensors.index.json").write_bytes(store.cat_file("/f/model.safetensors.index.json"))
        for name in ("sub/a.safetensors", "b.safetensors"):
            g = torch.Generator().manual_seed(seed * 10 + len(name))
            key = "layers.0.weight" if name.startswith("sub") else "layers.1.weight"
            save_file({key: torch.randn(40, 60, generator=g)}, str(folder / name))
    _upload(store, tmp_path / "local0" / "b.safetensors", "/f/b.safetensors")
    _upload(store, tmp_path / "local0" / "sub" / "a.safetensors", "/f/sub/a.safetensors")
    first = wbfe.score("memory://f/", stream=False)
    assert _scores(first)["layers"] == _scores(wbfe.score(tmp_path / "local0"))["layers"]
    _upload(store, tmp_path / "local1" / "sub" / "a.safetensors", "/f/sub/a.safetensors")  # re-uploaded
    (tmp_path / "local1" / "b.safetensors").write_bytes((tmp_path / "local0" / "b.safetensors").read_bytes())
    again = wbfe.score("memory://f/", stream=False)
    assert _scores(again)["layers"] == _scores(wbfe.score(tmp_path / "local1"))["layers"]
    assert again.model["sha256"] != first.model["sha256"]
    assert len([p for p in (tmp_path / "cache" / "objects").glob("*/*") if p.is_dir()]) == 2
    with pytest.raises(SourceNotFoundError, match=r"memory://f/model.safetensors.index.json: shard 'sub/a.safetensors' "
                       r"listed in the index is missing from the store \(no memory://f/sub/a.safetensors\)"):
        store.rm("/f/sub/a.safetensors")
        wbfe.score("memory://f/", stream=False)


@pytest.mark.parametrize("uri", ["w13listed://c/model.safetensors", "w13listed://c/"])
def test_a_store_that_caches_its_listings_is_asked_afresh_for_each_copy(tmp_path: Path, store: Any, uri: str) -> None:
    """s3fs answers ``info`` and ``ls`` from listings it cached earlier in the process, until ``invalidate_cache``: a
    second score of a re-uploaded object (``--no-stream``, a zoo ranked in one process) must key its copy by what the
    store says now. Before the fix the cached listing keyed it, and the old copy was scored again."""
    from fsspec.implementations.memory import MemoryFileSystem

    class Listed(MemoryFileSystem):  # memory:// with s3fs's listing cache
        protocol = ("w13listed",)
        cachable = False
        said: dict[Any, Any] = {}

        @classmethod
        def _strip_protocol(cls, path: str) -> str:
            return MemoryFileSystem._strip_protocol(path.removeprefix("w13listed://"))

        def info(self, path: str, **kw: Any) -> Any:
            return self.said.setdefault(("info", self._strip_protocol(path)), super().info(path, **kw))

        def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
            return self.said.setdefault(("ls", self._strip_protocol(path), detail), super().ls(path, detail, **kw))

        def invalidate_cache(self, path: str | None = None) -> None:
            self.said.clear()

    fsspec.register_implementation("w13listed", Listed, clobber=True)
    zoo = make_zoo(tmp_path / "zoo", 2).parent
    for i in (0, 1):
        _upload(store, zoo / f"m{i}.safetensors", "/c/model.safetensors")  # the memory store Listed shares
        scored = wbfe.score(uri, stream=False)
        assert _scores(scored)["layers"] == _scores(wbfe.score(zoo / f"m{i}.safetensors"))["layers"]


def test_a_reused_copy_counts_as_recently_used_for_prune(tmp_path: Path, store: Any) -> None:
    """`wbfe cache prune --older-than` keeps a copy that was just scored again, however old its
    first fetch."""
    import os

    from wbfe.ranking.cache_admin import prune_cache

    zoo = make_zoo(tmp_path / "zoo", 1).parent
    _upload(store, zoo / "m0.safetensors", "/b/m.safetensors")
    wbfe.score("memory://b/m.safetensors")
    (copy,) = [p for p in (tmp_path / "cache" / "objects").glob("*/*") if p.is_dir()]
    month_ago = copy.stat().st_mtime - 30 * 86400
    for path in (copy, *copy.rglob("*")):
        os.utime(path, (month_ago, month_ago))
    assert [u.path for u in prune_cache(tmp_path / "cache", max_size=None, older_than=7.0, dry_run=True).removed] == [copy]
    wbfe.score("memory://b/m.safetensors")  # reused, not fetched again
    # Marked by its folder's modification time: reading the files moves their access times only
    # where the mount records them (not under noatime, nor within a day of the last under relatime).
    assert copy.stat().st_mtime > month_ago + 29 * 86400
    assert prune_cache(tmp_path / "cache", max_size=None, older_than=7.0, dry_run=True).removed == []


def test_a_zoo_of_uris_ranks_exactly_as_the_local_zoo(tmp_path: Path, store: Any) -> None:
    spec = make_zoo(tmp_path / "zoo", 4, unusable=True)
    lines = spec.read_text().splitlines()
    for f in spec.parent.glob("*.safetensors"):
        _upload(store, f, f"/zoo/{f.name}")
    remote_spec = tmp_path / "remote.csv"
    remote_spec.write_text("\n".join([lines[0]] + [
        ",".join([m, f"memory://zoo/{ckpt}", q]) for m, ckpt, q in (row.split(",") for row in lines[1:])]) + "\n")
    kw: dict[str, Any] = dict(metrics="bfe,htsr", n_boot=200, n_perm=200)
    local = rank(spec, cache_dir=tmp_path / "local-cache", **kw)
    remote = rank(remote_spec, cache_dir=tmp_path / "remote-cache", **kw)

    def plain(result: Any) -> dict[str, Any]:
        out = without_run_details(result.to_dict())
        out["models"] = [{k: v for k, v in m.items() if k != "ref"} for m in out["models"]]
        out.pop("zoo", None)
        out["failed"] = [{**f, "reason": f["reason"].replace(str(spec.parent), "memory://zoo")} for f in out["failed"]]
        return out

    assert plain(remote) == plain(local)
    assert [m.ref for m in remote.models] == [f"memory://zoo/m{k}.safetensors" for k in range(4)]
    assert [f.model for f in remote.failed] == ["broken"]
    # The score cache works for URIs: a re-run takes the four from it.
    again = rank(remote_spec, cache_dir=tmp_path / "remote-cache", **kw)
    # n_scored is documented as models scored in this run: "broken" was tried again and failed, so it is 0 (was 1)
    assert (again.n_cached, again.n_scored) == (4, 0) and plain(again) == plain(local)


def test_file_uris_are_read_too(tmp_path: Path, store: Any) -> None:
    folder = make_sharded(tmp_path / "sharded")
    assert _scores(wbfe.score(folder.as_uri())) == _scores(wbfe.score(folder))


@pytest.mark.parametrize("stream", [True, False])
def test_shards_named_with_a_hash_or_a_space_are_read_through_one_join(tmp_path: Path, store: Any,
                                                                          stream: bool) -> None:
    """Shards named "a#1.safetensors" and "b c.safetensors", under a folder URI and an index URI, streamed and
    copied, in fsspec's memory store and a file:// one: every join of a folder and a name (the copy of a folder,
    an index's shards, the streamed files) is ``store_path``'s, and the scores are the local folder's."""
    import json

    folder = make_sharded(tmp_path / "sharded", n_shards=2)
    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    renamed = dict(zip(sorted(set(weight_map.values())), ["a#1.safetensors", "b c.safetensors"]))
    for old, new in renamed.items():
        (folder / old).rename(folder / new)
    index.write_text(json.dumps({"weight_map": {tensor: renamed[shard] for tensor, shard in weight_map.items()}}))
    _upload(store, folder, "/bucket/odd")
    local = _scores(wbfe.score(folder))
    for uri in ("memory://bucket/odd/", f"memory://bucket/odd/{index.name}", folder.as_uri(), index.as_uri()):
        remote = _scores(wbfe.score(uri, stream=stream))  # (an index named alone is read without config.json)
        assert (remote["layers"], remote["skipped"]) == (local["layers"], local["skipped"]), uri


@pytest.mark.parametrize("uri, error, message", [
    ("memory://bucket/absent.safetensors", SourceNotFoundError, "no such object: memory://bucket/absent"),
    ("memory://bucket/empty/", SourceNotFoundError, "no weight files"),
    ("nosuchproto://bucket/m.safetensors", SourceNotFoundError, "unknown protocol 'nosuchproto'"),
])
def test_bad_uris_are_typed_errors(store: Any, uri: str, error: type, message: str) -> None:
    store.pipe_file("/bucket/empty/readme.txt", b"no weights here")
    with pytest.raises(error, match=message):
        wbfe.score(uri)


def test_an_empty_store_folder_lists_every_format_as_a_local_one_does(tmp_path: Path, store: Any) -> None:
    # The store's copy path listed 9 suffixes of its own while TFLite, NumPy, Flax, TorchScript... are read too.
    store.pipe_file("/bucket/empty/readme.txt", b"no weights here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceNotFoundError) as local:
        wbfe.score(tmp_path / "empty")
    with pytest.raises(SourceNotFoundError) as remote:
        wbfe.score("memory://bucket/empty/")
    why = str(local.value).split(": ", 1)[1]
    assert "*.tflite" in why and str(remote.value) == f"memory://bucket/empty/: {why}"


def test_a_protocol_whose_package_is_missing_names_it(store: Any) -> None:
    import importlib.util

    if importlib.util.find_spec("s3fs") is not None:
        pytest.skip("s3fs is installed here")
    with pytest.raises(MissingDependencyError, match=r"s3:// protocol needs s3fs: pip install s3fs$"):
        wbfe.score("s3://bucket/model/")


def test_missing_fsspec_names_the_extra(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_fsspec(name: str, *a: Any, **kw: Any) -> Any:
        if name == "fsspec" or name.startswith("fsspec."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_fsspec)
    with pytest.raises(MissingDependencyError, match=r"need fsspec: pip install 'wbfe\[fsspec\]'$"):
        wbfe.score("s3://bucket/model/")


def test_the_cli_scores_a_uri_and_refuses_a_missing_one(tmp_path: Path, store: Any) -> None:
    from typer.testing import CliRunner
    from wbfe_cli.main import app

    local = make_zoo(tmp_path / "zoo", 1).parent / "m0.safetensors"
    _upload(store, local, "/b/m0.safetensors")
    ok = CliRunner().invoke(app, ["score", "memory://b/m0.safetensors", "--format", "json"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(app, ["score", "memory://b/absent.safetensors"])
    assert bad.exit_code == 2 and "no such object: memory://b/absent.safetensors" in bad.output
