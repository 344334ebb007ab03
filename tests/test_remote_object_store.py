"""Streaming safetensors from object-store URIs (wbfe.sources.object_location, store_range) with
ranged fsspec reads: fsspec's ``memory://`` store, and ``fakes3://``, an in-memory store defined
here that behaves as s3fs does where it matters (a ranged ``cat_file`` per read, ``fs.info`` with
an ETag, and on a versioned bucket a ``VersionId`` that ``cat_file(version_id=)`` reads; as gcsfs,
a ranged ``cat_file`` split into parallel requests unless given ``concurrency=1``), counts every
call and injects faults.

Every streamed score is compared with the score of the same bytes read from a local file (or the
copied object): equal rows, skips and summaries, not merely close ones."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

import wbfe
from tests.ray_zoo import make_sharded
from tests.test_remote_stream import assert_streams_the_files_bytes, make_checkpoint, same_scores, spans
from wbfe.errors import (CorruptCheckpointError, InvalidOptionError, RangeNotSupportedError, RemoteChangedError,
                         RemoteReadError, SourceNotFoundError)
from wbfe.sources import http_range, open_source, remote
from wbfe.sources.http_range import FIRST_READ, RetryPolicy

fsspec = pytest.importorskip("fsspec")
from fsspec.spec import AbstractFileSystem  # noqa: E402

QUICK = RetryPolicy(attempts=3, backoff=0.001, backoff_max=0.01, timeout=5.0)
URI = "fakes3://bucket/models/m.safetensors"
KEY = "bucket/models/m.safetensors"


class Bucket:
    """The fake store's objects (every version kept), its call log and the faults still to inject."""

    def __init__(self) -> None:
        self.objects: dict[str, list[bytes]] = {}
        self.versioned = False
        self.log: list[tuple[Any, ...]] = []  # ("cat", path, start, end, version_id) / ("info", path) / ("open", path)
        self.faults: list[tuple[str, str]] = []  # (path, fault), taken in order by the cat_file calls on path
        self.replacement: bytes = b""
        self.identity: str | None = "ETag"  # what info() says of an object's content (None: only its size)

    def put(self, path: str, data: bytes) -> None:
        self.objects.setdefault(path, []).append(data)

    def cats(self, path: str) -> list[tuple[int, int, Any]]:
        return [(start, end, version) for op, p, *rest in self.log if op == "cat" and p == path
                for start, end, version in [rest]]

    def infos(self, path: str) -> int:
        return sum(1 for op, p, *_ in self.log if op == "info" and p == path)


class FakeS3(AbstractFileSystem):
    """An in-memory object store with s3fs's shape (see the module docs)."""

    protocol = ("fakes3",)
    root_marker = ""
    cachable = False
    bucket = Bucket()

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        self.bucket.log.append(("info", path))
        if path in self.bucket.objects:
            versions = self.bucket.objects[path]
            out = {"name": path, "size": len(versions[-1]), "type": "file"}
            if self.bucket.identity is not None:
                out[self.bucket.identity] = '"' + hashlib.md5(versions[-1]).hexdigest() + '"'
            if self.bucket.versioned:
                out["VersionId"] = f"v{len(versions)}"
            return out
        if any(key.startswith(path.rstrip("/") + "/") for key in self.bucket.objects):
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        prefix = self._strip_protocol(path).rstrip("/") + "/"
        names = sorted({prefix + key[len(prefix):].split("/", 1)[0] for key in self.bucket.objects
                        if key.startswith(prefix)})
        entries = [self.info(name) for name in names]
        return entries if detail else [e["name"] for e in entries]

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, version_id: str | None = None,
                 concurrency: int = 2, **kwargs: Any) -> bytes:
        path = self._strip_protocol(path)
        # As gcsfs: a range is split into `concurrency` requests unless told 1.
        cut = [start, end] if concurrency == 1 or start is None or end is None else [start, (start + end) // 2, end]
        self.bucket.log.extend(("cat", path, a, b, version_id) for a, b in zip(cut, cut[1:]))
        fault = self.bucket.faults.pop(0)[1] if self.bucket.faults and self.bucket.faults[0][0] == path else "none"
        if fault == "replace":  # a new upload lands just before this answer
            self.bucket.put(path, self.bucket.replacement)
        elif fault == "gone":
            del self.bucket.objects[path]
        elif fault in ("connection", "timeout", "denied", "odd"):
            raise {"connection": ConnectionResetError("connection reset by peer"),
                   "timeout": TimeoutError("read timed out"), "denied": PermissionError("AccessDenied"),
                   "odd": RuntimeError("the SDK's own error")}[fault]
        if path not in self.bucket.objects:
            raise FileNotFoundError(path)
        versions = self.bucket.objects[path]
        if version_id is not None:
            if not self.bucket.versioned:
                raise ValueError("version_id on an unversioned bucket")
            data = versions[int(version_id[1:]) - 1]
        else:
            data = versions[-1]
        data = data[start:end]
        return data[:-1] if fault == "short" else data

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:  # the copy path (get_file)
        path = self._strip_protocol(path)
        self.bucket.log.append(("open", path))
        return io.BytesIO(self.bucket.objects[path][-1])


fsspec.register_implementation("fakes3", FakeS3, clobber=True)


@pytest.fixture()
def bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bucket]:
    """An empty fake bucket (and memory store), a fresh wbfe cache folder, quick retries."""
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(http_range, "DEFAULT_POLICY", QUICK)
    FakeS3.bucket = Bucket()
    memory = fsspec.filesystem("memory")
    memory.store.clear()
    yield FakeS3.bucket
    memory.store.clear()


def test_a_streamed_object_scores_as_the_local_file_with_one_request_a_tensor(tmp_path: Path, bucket: Bucket) -> None:
    local = make_checkpoint(tmp_path / "m.safetensors")
    data = local.read_bytes()
    bucket.put(KEY, data)
    streamed = wbfe.score(URI, stream=True)
    same_scores(streamed, wbfe.score(str(local)))
    assert streamed.model["transport"] == "stream" and streamed.model["files"] == [URI]
    assert not (tmp_path / "cache").exists()  # nothing written: no copy in the object cache
    cats = bucket.cats(KEY)
    # The header with one read of FIRST_READ bytes, then one read per tensor past it, each of exactly
    # the tensor's bytes not read yet; nothing else: the answers add up to the file, each byte once.
    assert cats[0] == (0, FIRST_READ, None)
    expected = sorted((max(a, FIRST_READ), b + 1) for a, b in spans(data).values() if b >= FIRST_READ)
    assert sorted((start, end) for start, end, _ in cats[1:]) == expected and len(expected) == 2
    assert sum(end - start for start, end, _ in cats) == len(data)
    # Unversioned: the identity is taken once (the first fs.info), then checked after each read.
    assert bucket.infos(KEY) == 1 + len(cats)
    # The copy path gives the same score.
    copied = wbfe.score(URI, stream=False)
    assert "transport" not in copied.model
    same_scores(copied, streamed)
    assert [p.read_bytes() for p in (tmp_path / "cache" / "objects").rglob("m.safetensors")] == [data]


def test_streamed_tensors_hold_the_objects_bytes(tmp_path: Path, bucket: Bucket) -> None:
    local = make_checkpoint(tmp_path / "m.safetensors")
    bucket.put(KEY, local.read_bytes())
    assert_streams_the_files_bytes(URI, local)


def test_a_sharded_folder_streams_with_its_config(tmp_path: Path, bucket: Bucket) -> None:
    folder = make_sharded(tmp_path / "sharded")
    config = {"model_type": "llama", "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(config))
    memory = fsspec.filesystem("memory")
    for f in sorted(folder.iterdir()):
        memory.pipe_file(f"/bucket/sharded/{f.name}", f.read_bytes())
    memory.pipe_file("/bucket/sharded/optimizer.pt", b"beside the weights, not one of them: never read")
    streamed = wbfe.score("memory://bucket/sharded/", stream=True)
    same_scores(streamed, wbfe.score(folder))
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    assert streamed.model["files"] == ["memory://bucket/sharded/model.safetensors.index.json"] + [
        f"memory://bucket/sharded/{s}" for s in shards]
    with open_source("memory://bucket/sharded", stream=True) as source:
        assert source.config == wbfe.sources.local.read_model_config(folder) and source.config is not None
        assert source.config["model_type"] == "llama"
    assert not (tmp_path / "cache").exists()
    # The index named alone streams its shards beside it (and no config: a file named alone is read alone).
    for f in sorted(folder.iterdir()):
        bucket.put(f"bucket/sharded/{f.name}", f.read_bytes())
    alone = wbfe.score("fakes3://bucket/sharded/model.safetensors.index.json", stream=True)
    same_scores(alone, wbfe.score(folder / "model.safetensors.index.json"))
    assert [op for op, path, *_ in bucket.log if path.endswith(".json") and op == "cat"] == ["cat"]  # the index only


def test_a_tensor_the_index_lists_but_its_streamed_shard_lacks_is_named_by_the_shards_uri(bucket: Bucket) -> None:
    import numpy as np
    from safetensors.numpy import save

    memory = fsspec.filesystem("memory")
    memory.pipe_file("/bucket/lacking/a.safetensors", save({"x": np.ones((2, 2), np.float32)}))
    memory.pipe_file("/bucket/lacking/model.safetensors.index.json",
                     json.dumps({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}}).encode())
    with pytest.raises(CorruptCheckpointError, match=r"^memory://bucket/lacking/a\.safetensors: tensor 'y' listed in "
                                                     r"the index is not in this shard$"):
        open_source("memory://bucket/lacking/model.safetensors.index.json", stream=True)


def test_by_default_an_object_larger_than_the_free_disk_is_streamed(tmp_path: Path, bucket: Bucket,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    folder = make_sharded(tmp_path / "sharded")
    for f in sorted(folder.iterdir()):
        bucket.put(f"bucket/big/{f.name}", f.read_bytes())
    total = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    asked: list[Path] = []
    monkeypatch.setattr(remote, "free_disk", lambda f: asked.append(f) or total - 1)
    streamed = wbfe.score("fakes3://bucket/big/")
    assert streamed.model["transport"] == "stream" and asked == [tmp_path / "cache" / "objects"]
    assert not (tmp_path / "cache").exists()
    same_scores(streamed, wbfe.score(folder))
    # With room on the disk it is copied, as before; the decision needed the index alone.
    monkeypatch.setattr(remote, "free_disk", lambda f: asked.append(f) or total)
    bucket.log.clear()
    copied = wbfe.score("fakes3://bucket/big/")
    assert "transport" not in copied.model
    assert [path for op, path, *_ in bucket.log if op == "cat"] == ["bucket/big/model.safetensors.index.json"]
    assert sorted(p.name for p in (tmp_path / "cache" / "objects").rglob("*.safetensors")) == sorted(
        p.name for p in folder.glob("*.safetensors"))
    same_scores(copied, streamed)
    asked.clear()
    wbfe.score("fakes3://bucket/big/", stream=False)  # --no-stream never asks
    assert asked == []


@pytest.mark.parametrize("fault", ["replace", "gone"])
def test_an_object_that_changes_mid_run_is_an_error_never_a_score(tmp_path: Path, bucket: Bucket, fault: str) -> None:
    local = make_checkpoint(tmp_path / "m.safetensors")
    bucket.put(KEY, local.read_bytes())
    bucket.replacement = make_checkpoint(tmp_path / "other.safetensors").read_bytes()[:-4] + b"    "
    bucket.faults = [(KEY, "none"), (KEY, "none"), (KEY, fault)]  # the header, a tensor, then the change
    with pytest.raises(RemoteChangedError, match=f"{URI}: the remote file changed while it was read"):
        wbfe.score(URI, stream=True)
    assert not (tmp_path / "cache").exists()


def test_an_object_the_store_says_nothing_of_but_its_size_is_copied_not_streamed(tmp_path: Path,
                                                                               bucket: Bucket) -> None:
    """A store whose fs.info gives no ETag, hash, time or version: a same-size upload between two reads would go
    unseen, so --stream refuses it after fs.info and by default it is copied; HfFileSystem's blob_id (hf://) is
    what changes with the content there: such an object is streamed, and its change is seen."""
    local = make_checkpoint(tmp_path / "m.safetensors")
    bucket.put(KEY, local.read_bytes())
    bucket.replacement = bytes(reversed(local.read_bytes()))
    bucket.identity = None
    bucket.faults = [(KEY, "none"), (KEY, "replace")]
    with pytest.raises(RangeNotSupportedError, match=f"{URI}: the store reports nothing of the object but its size"):
        wbfe.score(URI, stream=True)
    assert bucket.cats(KEY) == []
    bucket.faults.clear()
    copied = wbfe.score(URI)
    same_scores(copied, wbfe.score(str(local)))
    assert copied.model.get("transport") is None
    bucket.identity = "blob_id"
    bucket.faults = [(KEY, "none"), (KEY, "none"), (KEY, "replace")]
    with pytest.raises(RemoteChangedError, match=f"{URI}: the remote file changed while it was read"):
        wbfe.score(URI, stream=True)


def test_a_versioned_object_is_read_at_the_version_first_seen(tmp_path: Path, bucket: Bucket) -> None:
    local = make_checkpoint(tmp_path / "m.safetensors")
    bucket.versioned = True
    bucket.put(KEY, local.read_bytes())
    gen_other = make_checkpoint(tmp_path / "x" / "m.safetensors").read_bytes()
    bucket.replacement = bytes(reversed(gen_other))  # a new upload mid-run: same size, other bytes
    bucket.faults = [(KEY, "none"), (KEY, "replace")]
    streamed = wbfe.score(URI, stream=True)
    same_scores(streamed, wbfe.score(str(local)))  # every read at v1: pinned, not mixed
    assert len(bucket.objects[KEY]) == 2
    assert {version for *_, version in bucket.cats(KEY)} == {"v1"}
    assert bucket.infos(KEY) == 1  # pinned reads need no checks


@pytest.mark.parametrize("fault", ["connection", "timeout", "short"])
def test_a_transient_fault_is_retried_and_the_score_is_the_local_ones(tmp_path: Path, bucket: Bucket,
                                                                      fault: str) -> None:
    local = make_checkpoint(tmp_path / "m.safetensors")
    bucket.put(KEY, local.read_bytes())
    bucket.faults = [(KEY, "none"), (KEY, fault)]
    same_scores(wbfe.score(URI, stream=True), wbfe.score(str(local)))
    ranges = [(start, end) for start, end, _ in bucket.cats(KEY)[1:]]
    # The faulty read was asked for once more; every other range once.
    assert ranges[0] == ranges[1] and len(ranges) == len(set(ranges)) + 1
    assert bucket.faults == []


def test_a_lasting_fault_is_a_one_line_error_after_the_retries(tmp_path: Path, bucket: Bucket) -> None:
    bucket.put(KEY, make_checkpoint(tmp_path / "m.safetensors").read_bytes())
    bucket.faults = [(KEY, "none")] + [(KEY, "short")] * QUICK.attempts
    with pytest.raises(RemoteReadError, match=rf"{URI}: bytes \d+-\d+ could not be read in 3 tries "
                                              r"\(last: _Short: asked for \d+ bytes from byte \d+, got \d+\)$"):
        wbfe.score(URI, stream=True)


@pytest.mark.parametrize("fault, message", [("denied", "access refused (PermissionError: AccessDenied)"),
                                            ("odd", "cannot be read (RuntimeError: the SDK's own error)")])
def test_refused_access_and_a_stores_own_errors_are_not_retried(tmp_path: Path, bucket: Bucket, fault: str,
                                                                 message: str) -> None:
    bucket.put(KEY, make_checkpoint(tmp_path / "m.safetensors").read_bytes())
    bucket.faults = [(KEY, "none"), (KEY, fault)]
    with pytest.raises(RemoteReadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        wbfe.score(URI, stream=True)
    assert len(bucket.cats(KEY)) == 2


def test_stream_is_refused_for_objects_it_cannot_read(tmp_path: Path, bucket: Bucket) -> None:
    bucket.put("bucket/pickled/pytorch_model.bin", b"not read")
    with pytest.raises(InvalidOptionError, match="fakes3://bucket/pickled/: --stream reads safetensors weights; "
                                                 "this holds pytorch_model.bin: drop --stream"):
        wbfe.score("fakes3://bucket/pickled/", stream=True)
    bucket.put("bucket/adapter/adapter_config.json", b"{}")
    bucket.put("bucket/adapter/adapter_model.safetensors", b"not read")
    with pytest.raises(InvalidOptionError, match="this holds a PEFT adapter"):
        wbfe.score("fakes3://bucket/adapter", stream=True)
    bucket.put("bucket/empty/readme.txt", b"no weights here")
    with pytest.raises(SourceNotFoundError,
                       match=r"fakes3://bucket/empty/: no weight files \(\*\.safetensors, \*\.bin"):
        wbfe.score("fakes3://bucket/empty/", stream=True)
    assert [op for op, *_ in bucket.log if op == "cat"] == []


def test_the_cli_streams_a_uri_and_reports_a_change_in_one_line_with_exit_2(tmp_path: Path, bucket: Bucket) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    local = make_checkpoint(tmp_path / "m.safetensors")
    bucket.put(KEY, local.read_bytes())
    runner = CliRunner()
    ok = runner.invoke(app, ["score", URI, "--stream", "-f", "json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["layers"] == json.loads(wbfe.score(str(local)).to_json())["layers"]
    bucket.replacement = bytes(reversed(local.read_bytes()))
    bucket.faults = [(KEY, "none"), (KEY, "replace")]
    changed = runner.invoke(app, ["score", URI, "--stream"])
    assert changed.exit_code == 2 and "Traceback" not in changed.output
    assert "the remote file changed while it was read" in changed.output
    assert len(changed.output.strip().splitlines()) == 1


def test_the_back_off_between_tries_is_the_policys_fixed_schedule(tmp_path: Path, bucket: Bucket) -> None:
    from wbfe.sources.store_range import StoreFile

    data = make_checkpoint(tmp_path / "m.safetensors").read_bytes()
    bucket.put(KEY, data)
    fs = fsspec.filesystem("fakes3")
    waits: list[float] = []
    policy = RetryPolicy(attempts=4, backoff=0.5, backoff_max=1.5)
    file = StoreFile(fs, KEY, URI, policy=policy, sleep=waits.append)
    bucket.faults = [(KEY, "timeout"), (KEY, "connection"), (KEY, "short")]
    assert file.head(16) == data[:16]
    assert waits == [0.5, 1.0, 1.5]  # doubled from backoff, cut at backoff_max
    assert (file.requests, file.bytes_fetched) == (2, 16 + 15)  # the two answers: the short one, then the good one
    waits.clear()
    bucket.faults = [(KEY, "timeout")] * 4
    with pytest.raises(RemoteReadError, match=rf"{URI}: bytes 100-199 could not be read in 4 tries "
                                              r"\(last: TimeoutError: read timed out\)$"):
        file.read_bytes(100, 100)
    assert waits == [0.5, 1.0, 1.5]
