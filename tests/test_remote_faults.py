"""The remote path under faults, on a loopback server that injects them (tests/remote_server.py):
a connection dropped mid-tensor, a short body, a wrong Content-Range, a file that changes between
requests, a slow trickle, 5xx and 429 answers. Each ends in a retry that succeeds (the score then
equals the local file's) or in a clear one-line error; never in a number computed from mixed or
missing bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

import wbfe
from tests.remote_server import Repo, Server, isolated_hub
from tests.test_remote_stream import make_checkpoint, same_scores
from wbfe.errors import CorruptCheckpointError, RemoteChangedError, RemoteReadError
from wbfe.sources import http_range
from wbfe.sources.http_range import FIRST_READ, RemoteFile, RetryPolicy

QUICK = RetryPolicy(attempts=3, backoff=0.001, backoff_max=0.01, timeout=5.0)
PATH = "/m.safetensors"


@pytest.fixture()
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    isolated_hub(monkeypatch, tmp_path)
    monkeypatch.setattr(http_range, "DEFAULT_POLICY", QUICK)
    with Server() as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.endpoint)
        yield srv


@pytest.fixture()
def local(tmp_path: Path, server: Server) -> Path:
    """The checkpoint, also served at PATH."""
    path = make_checkpoint(tmp_path / "m.safetensors")
    server.state.files[PATH] = path.read_bytes()
    return path


def after_header(server: Server, fault: str) -> None:
    """Inject ``fault`` from the first tensor request on (the header's read is answered plainly)."""
    server.state.faults.extend([(PATH, "none"), (PATH, fault)])


def tensor_ranges(server: Server) -> list[str | None]:
    return [r.range for r in server.state.ranged(PATH) if r.range != f"bytes=0-{FIRST_READ - 1}"]


@pytest.mark.parametrize("fault", ["drop", "short", "bad_range", "status:500", "status:503", "status:429"])
def test_a_fault_once_is_retried_and_the_score_is_the_local_ones(server: Server, local: Path, fault: str) -> None:
    after_header(server, fault)
    same_scores(wbfe.score(server.url(PATH), stream=True), wbfe.score(str(local)))
    ranges = tensor_ranges(server)
    # The faulty request's range was asked for once more; every other range once.
    assert ranges.count(ranges[0]) == 2 and len(ranges) == len(set(ranges)) + 1
    assert server.state.faults == []


@pytest.mark.parametrize(("fault", "last"), [
    ("drop!", r"short read|IncompleteRead"),
    ("short!", r"a Content-Length of \d+ for \d+ bytes"),
    ("bad_range!", r"asked for bytes \d+-\d+, the answer holds \d+-\d+/\d+"),
    ("status:503!", r"HTTP 503"),
])
def test_a_lasting_fault_is_a_one_line_error_after_the_retries(server: Server, local: Path, fault: str,
                                                              last: str) -> None:
    after_header(server, fault)
    with pytest.raises(RemoteReadError, match=rf"m\.safetensors: bytes \d+-\d+ could not be read in 3 tries "
                                              rf"\(last: .*({last})") as info:
        wbfe.score(server.url(PATH), stream=True)
    assert "\n" not in str(info.value)
    ranges = tensor_ranges(server)
    assert len(ranges) == 3 and len(set(ranges)) == 1  # three tries of one tensor, then no further request


@pytest.mark.parametrize("if_match", [True, False])
def test_a_file_that_changes_between_requests_is_an_error_never_a_score(server: Server, local: Path,
                                                                        if_match: bool) -> None:
    # With If-Match honoured the server answers 412; without, the new ETag gives it away.
    server.state.honour_if_match = if_match
    after_header(server, "change")
    with pytest.raises(RemoteChangedError, match="m.safetensors: the remote file changed while it was read") as info:
        wbfe.score(server.url(PATH), stream=True)
    assert isinstance(info.value, CorruptCheckpointError)
    assert ("412" in str(info.value)) == if_match
    assert len(tensor_ranges(server)) == 1  # not retried


def test_a_hub_file_served_from_another_commit_is_an_error(tmp_path: Path, server: Server) -> None:
    local = make_checkpoint(tmp_path / "model.safetensors")
    server.state.repos["org/moving"] = Repo({"model.safetensors": local.read_bytes()})
    key = "/resolve/" + "a" * 40 + "/model.safetensors#commit"
    server.state.faults.extend([(key, "none"), (key, "commit")])
    with pytest.raises(RemoteChangedError, match="its commit went from a{40} to b{40}"):
        wbfe.score("org/moving", stream=True)


def test_a_trickle_is_cut_at_its_deadline_and_retried(server: Server, local: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # 0.5 s of grace plus the body at 1 MB/s; the trickle sends 256 bytes every 20 ms (12.8 kB/s).
    monkeypatch.setattr(http_range, "DEFAULT_POLICY", RetryPolicy(attempts=3, backoff=0.001, timeout=0.5,
                                                                  min_rate=1e6))
    after_header(server, "trickle")
    same_scores(wbfe.score(server.url(PATH), stream=True), wbfe.score(str(local)))
    ranges = tensor_ranges(server)
    assert ranges.count(ranges[0]) == 2
    after_header(server, "trickle!")
    with pytest.raises(RemoteReadError, match=r"could not be read in 3 tries \(last: too slow: \d+ of \d+ bytes"):
        wbfe.score(server.url(PATH), stream=True)


def test_a_stalled_answer_times_out_and_is_retried(server: Server, local: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_range, "DEFAULT_POLICY", RetryPolicy(attempts=3, backoff=0.001, timeout=0.5))
    after_header(server, "stall")
    same_scores(wbfe.score(server.url(PATH), stream=True), wbfe.score(str(local)))
    ranges = tensor_ranges(server)
    assert ranges.count(ranges[0]) == 2


def test_the_back_off_is_a_fixed_schedule_and_retry_after_is_honoured_within_its_bound(server: Server,
                                                                                      local: Path) -> None:
    waits: list[float] = []
    policy = RetryPolicy(attempts=4, backoff=0.5, backoff_max=1.5, retry_after_max=5.0)
    server.state.faults.append((PATH, "status:500!"))
    with pytest.raises(RemoteReadError, match="could not be read in 4 tries"):
        RemoteFile(server.url(PATH), policy=policy, sleep=waits.append).head()
    assert waits == [0.5, 1.0, 1.5]  # doubled each time, capped; no jitter, no wait after the last try
    server.state.faults[:] = [(PATH, "status:429:2"), (PATH, "status:429:600")]
    waits.clear()
    file = RemoteFile(server.url(PATH), policy=policy, sleep=waits.append)
    assert file.head(16) == local.read_bytes()[:16]
    assert waits == [2.0, 5.0]  # the server's Retry-After, and a longer one cut to retry_after_max


def test_the_cli_reports_a_changed_file_in_one_line_with_exit_2(server: Server, local: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    after_header(server, "change")
    result = CliRunner().invoke(app, ["score", server.url(PATH), "--stream"])
    assert result.exit_code == 2
    assert "the remote file changed while it was read" in result.output and "Traceback" not in result.output
