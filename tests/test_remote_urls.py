"""What a URL names, as a user hits it: a signed index URL (its query carried to each shard), a server that sends
no validator (a swap between two reads must not mix files), the answers a server may give to a range request, the
copies a URL's download keeps, and a hub whose model info names no commit. Served from the loopback server of
tests/remote_server.py, never the network."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import huggingface_hub
import pytest

import wbfe
from tests.ray_zoo import make_sharded
from tests.remote_server import Repo, Server, isolated_hub
from tests.test_remote_stream import make_checkpoint, same_scores
from wbfe.errors import ModelNotFoundError, RangeNotSupportedError, RemoteReadError
from wbfe.sources import http_range, remote
from wbfe.sources.http_range import RetryPolicy

SIGNED = "X-Amz-Signature=abc%2Fdef&X-Amz-Expires=60"


@pytest.fixture()
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    isolated_hub(monkeypatch, tmp_path)
    monkeypatch.setattr(http_range, "DEFAULT_POLICY", RetryPolicy(attempts=2, backoff=0.001, timeout=5.0))
    with Server() as srv:
        yield srv


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "downloaded"])
def test_a_signed_index_url_signs_every_shard_it_names(tmp_path: Path, server: Server, stream: bool) -> None:
    """The index's query (a pre-signed URL's signature, a token) goes with each shard's URL: the server refuses
    any request without it, and the score equals the local folder's."""
    folder = make_sharded(tmp_path / "sharded")
    for path in folder.iterdir():
        server.state.files[f"/org/{path.name}"] = path.read_bytes()
    server.state.query = SIGNED
    got = wbfe.score(server.url(f"/org/model.safetensors.index.json?{SIGNED}"), stream=stream, metrics="bfe")
    assert {r.status for r in server.state.log} <= {200, 206}
    shards = set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())
    assert {r.path for r in server.state.log} >= {f"/org/{name}" for name in shards}
    local = wbfe.score(str(folder), metrics="bfe")
    assert (got.layers, got.skipped) == (local.layers, local.skipped)  # a URL's config.json is not fetched
    # the signature read the checkpoint; it is not written into the JSON that is shared (it was, in every URL)
    said = got.to_json()
    assert "abc%2Fdef" not in said and "abc/def" not in said
    assert got.model["source"] == server.url("/org/model.safetensors.index.json?X-Amz-Signature=REDACTED&X-Amz-"
                                             "Expires=REDACTED")
    assert not stream or all(f.endswith("?X-Amz-Signature=REDACTED&X-Amz-Expires=REDACTED") for f in got.model["files"])
    if stream:  # a signature refused: the message says the query was sent
        with pytest.raises(RemoteReadError, match=r"access refused \(HTTP 403\); the URL's query was sent with it"):
            wbfe.score(server.url("/org/model.safetensors.index.json?X-Amz-Signature=old"), stream=True)


def test_a_file_served_without_a_validator_is_not_streamed_but_downloaded(tmp_path: Path, server: Server) -> None:
    """Neither ETag nor Last-Modified: a file swapped for another of the same size between two range reads could
    not be seen, so --stream refuses it after the header's read, and by default it is downloaded whole."""
    local = make_checkpoint(tmp_path / "m.safetensors")
    server.state.files["/m.safetensors"] = local.read_bytes()
    server.state.validators = False
    server.state.faults.extend([("/m.safetensors", "none"), ("/m.safetensors", "change")])  # swapped after the header
    with pytest.raises(RangeNotSupportedError, match=r"m\.safetensors: the server sends neither ETag nor Last-Modif"
                                                     r"ied.*score it with --no-stream \(stream=False\) to download "
                                                     r"it") as info:
        wbfe.score(server.url("/m.safetensors"), stream=True)
    assert "\n" not in str(info.value) and len(server.state.log) == 1
    server.state.faults.clear()
    server.state.files["/m.safetensors"] = local.read_bytes()
    same_scores(wbfe.score(server.url("/m.safetensors")), wbfe.score(str(local)))
    assert [r.status for r in server.state.log[2:] if r.status == 206] == []  # after the header: read whole


def test_a_range_sent_compressed_is_refused_at_once(tmp_path: Path, server: Server) -> None:
    """Content-Encoding gzip on a range (asked for identity): its bytes are not the file's, and a retry would get
    the same, so the first answer is an error that says so (it was retried six times as a wrong length)."""
    server.state.files["/m.safetensors"] = make_checkpoint(tmp_path / "m.safetensors").read_bytes()
    server.state.faults.extend([("/m.safetensors", "none"), ("/m.safetensors", "gzip!")])
    with pytest.raises(RemoteReadError, match=r"m\.safetensors: the server compressed the range asked for "
                                              r"\(Content-Encoding: gzip\)"):
        wbfe.score(server.url("/m.safetensors"), stream=True)
    assert len(server.state.log) == 2


def test_a_downloaded_url_re_uploaded_with_the_same_size_is_fetched_again(tmp_path: Path, server: Server) -> None:
    """A server that sends Last-Modified but no ETag: the copy is keyed on it, so a file replaced by another of
    the same size is downloaded again (the copy was keyed on the URL and the size alone, and the old one scored)."""
    first = make_checkpoint(tmp_path / "a" / "m.safetensors")
    data = first.read_bytes()
    other = tmp_path / "b" / "m.safetensors"
    other.parent.mkdir()
    other.write_bytes(data[:-4] + bytes(4))  # the head's last value changed: the same size
    server.state.validators = False
    for path, when in ((first, "Mon, 07 Dec 2026 00:00:00 GMT"), (other, "Mon, 07 Dec 2026 00:05:00 GMT")):
        server.state.files["/m.safetensors"] = path.read_bytes()
        server.state.last_modified["/m.safetensors"] = when
        same_scores(wbfe.score(server.url("/m.safetensors"), stream=False), wbfe.score(str(path)))


def test_a_signed_url_of_an_unchanged_object_reuses_its_copy_and_a_query_that_selects_a_file_does_not(
        tmp_path: Path, server: Server) -> None:
    """A pre-signed URL signs anew each time: the copy is found again by the path and the server's ETag and size
    (it was keyed by the whole URL, and the checkpoint downloaded again each run). A query that selects the file
    (``?file=a``) with the same path, size and Last-Modified but no ETag is another file: never the same copy."""
    local = make_checkpoint(tmp_path / "m.safetensors")
    data = local.read_bytes()
    server.state.files["/m.safetensors"] = data
    for signature in ("X-Amz-Signature=one", "X-Amz-Signature=two"):
        same_scores(wbfe.score(server.url(f"/m.safetensors?{signature}"), stream=False), wbfe.score(str(local)))
    assert [r.sent for r in server.state.log].count(len(data)) == 1  # one download for both scores
    other = tmp_path / "b" / "m.safetensors"
    other.parent.mkdir()
    other.write_bytes(data[:-4] + bytes(4))  # the head's last value changed: the same size
    server.state.validators = False
    server.state.last_modified["/m.safetensors"] = "Mon, 07 Dec 2026 00:00:00 GMT"
    server.state.files.update({"/m.safetensors?file=a": data, "/m.safetensors?file=b": other.read_bytes()})
    for query, path in (("file=a", local), ("file=b", other), ("file=a", local)):
        same_scores(wbfe.score(server.url(f"/m.safetensors?{query}"), stream=False), wbfe.score(str(path)))


def test_a_downloaded_url_served_with_a_size_alone_is_never_reused(tmp_path: Path, server: Server) -> None:
    """Neither ETag nor Last-Modified: a copy could not be told from another file of the same size, so it is
    downloaded again each time, and the provenance says so (the old copy was scored for the new file)."""
    first = make_checkpoint(tmp_path / "a" / "m.safetensors")
    other = tmp_path / "b" / "m.safetensors"
    other.parent.mkdir()
    other.write_bytes(first.read_bytes()[:-4] + bytes(4))  # the head's last value changed: the same size
    server.state.validators = False
    notes = []
    for path in (first, other):
        server.state.files["/m.safetensors"] = path.read_bytes()
        got = wbfe.score(server.url("/m.safetensors"), stream=False)
        same_scores(got, wbfe.score(str(path)))
        notes.append(got.model.get("copy", ""))
    assert all(n.startswith("downloaded again: the server reports nothing of it but its size") for n in notes)
    copies = list((tmp_path / "wbfe-cache" / "objects").rglob("m.safetensors"))
    assert [p.read_bytes() for p in copies] == [other.read_bytes()]  # the old copy removed, not left to pile up


def test_a_server_that_stops_honouring_ranges_in_a_default_stream_says_how_to_download(
        tmp_path: Path, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamed by wbfe's own choice (no free disk), then a 200 with the whole file for a tensor: the advice
    names the option that downloads it (it said "without --stream", which the user had not passed)."""
    monkeypatch.setattr(remote, "free_disk", lambda folder: 0)
    server.state.files["/m.safetensors"] = make_checkpoint(tmp_path / "m.safetensors").read_bytes()
    server.state.faults.extend([("/m.safetensors", "none"), ("/m.safetensors", "ignore_range")])
    with pytest.raises(RangeNotSupportedError, match=r"m\.safetensors: the server ignores HTTP range requests.*; "
                                                     r"score it with --no-stream \(stream=False\) to download it") as e:
        wbfe.score(server.url("/m.safetensors"))
    assert "without --stream" not in str(e.value)
    assert [r.status for r in server.state.log] == [206, 200]


def test_a_hub_model_whose_info_names_no_commit_is_read_at_the_commit_its_first_file_names(
        tmp_path: Path, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """model_info without ``sha``: every file is read at one commit, the one the hub's headers name (they were
    read at ``main``, unpinned, so a push between two reads went unseen), and the provenance names it."""
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    folder = make_sharded(tmp_path / "sharded")
    server.state.repos["org/r"] = Repo({p.name: p.read_bytes() for p in folder.iterdir()}, commit="c" * 40)
    server.state.no_sha = True
    got = wbfe.score("org/r", stream=True, metrics="bfe")
    first, *reads = [r for r in server.state.log if "/resolve/" in r.path]
    assert (first.path, first.sent) == ("/org/r/resolve/main/model.safetensors.index.json", 0)  # a HEAD: the commit
    assert reads and all(f"/resolve/{'c' * 40}/" in r.path for r in reads)
    assert got.model["commit"] == "c" * 40
    local = wbfe.score(str(folder), metrics="bfe")
    assert (got.layers, got.skipped) == (local.layers, local.skipped)
    # A hub that names no commit in its headers either: refused, not read at a moving main.
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, **kw: SimpleNamespace(commit_hash=None))
    with pytest.raises(ModelNotFoundError, match=r"^org/r: .*; the hub names no commit for it, so its files could "
                                                 r"change between two reads unseen; name a commit: org/r@<commit>$"):
        wbfe.score("org/r", stream=True)
