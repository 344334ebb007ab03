"""Remote reads honour the proxy settings of the environment (issue #45 §7): a loopback forward proxy
in the test logs every request it forwards to the loopback server (tests/remote_server.py), and
with ``HTTP_PROXY`` (or ``http_proxy``) set, every request of a streamed URL score, of a streamed
hub score and of a hub score without ``--stream`` goes through it, and the score equals the local
file's; with the server's host in ``NO_PROXY`` (or ``no_proxy``) none does. A proxy that is set but
down fails the read: the proxy is really used, never bypassed.

Before the fix the range reader opened its own ``http.client`` connections and ignored the
variables: the proxy saw none of the range requests."""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote, urlsplit

import pytest

import wbfe
from tests.ray_zoo import make_sharded
from tests.remote_server import Repo, Server, isolated_hub
from tests.test_remote_stream import make_checkpoint, same_scores
from wbfe.errors import RemoteReadError
from wbfe.sources import http_range
from wbfe.sources.http_range import RetryPolicy

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
# Headers of one hop, not forwarded (RFC 9110 §7.6.1), and those the proxy writes itself.
_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "content-length", "server", "date"}


class _Forward(BaseHTTPRequestHandler):
    """A forward proxy for http:// targets (absolute-form requests): logs, forwards, relays."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, str | None]]  # (method, URL path, Range)
    lock: threading.Lock

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        self._forward("GET")

    def do_HEAD(self) -> None:  # noqa: N802 - the http.server name
        self._forward("HEAD")

    def _forward(self, method: str) -> None:
        target = urlsplit(self.path)
        if target.scheme != "http" or not target.hostname:  # not a proxy request
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with self.lock:
            self.seen.append((method, unquote(target.path), self.headers.get("Range")))
        upstream = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=30)
        try:
            upstream.request(method, target.path + (f"?{target.query}" if target.query else ""),
                             headers={k: v for k, v in self.headers.items() if k.lower() not in _HOP})
            answer = upstream.getresponse()
            body = answer.read()
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            length = answer.getheader("Content-Length") if method == "HEAD" else None
            self.send_header("Content-Length", length or str(len(body)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)
        finally:
            upstream.close()


class Proxy:
    """``with Proxy() as p``: ``p.url``, ``p.seen`` (every request forwarded)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        handler = type("Handler", (_Forward,), {"seen": self.seen, "lock": threading.Lock()})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "Proxy":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _fresh_hub_session() -> None:
    """huggingface_hub reads the environment when it makes its session: a new one for the new variables."""
    from huggingface_hub import close_session

    close_session()


@pytest.fixture()
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    isolated_hub(monkeypatch, tmp_path)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setattr(http_range, "DEFAULT_POLICY", RetryPolicy(attempts=3, backoff=0.001, backoff_max=0.01,
                                                                  timeout=5.0))
    with Server() as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.endpoint)
        yield srv
    _fresh_hub_session()


@pytest.fixture()
def proxy() -> Iterator[Proxy]:
    with Proxy() as running:
        yield running


def _use_proxy(monkeypatch: pytest.MonkeyPatch, url: str, case: str, no_proxy: str | None = None) -> None:
    name = "HTTP_PROXY" if case == "upper" else "http_proxy"
    monkeypatch.setenv(name, url)
    if no_proxy is not None:
        monkeypatch.setenv("NO_PROXY" if case == "upper" else "no_proxy", no_proxy)
    _fresh_hub_session()


def _through_proxy(server: Server, proxy: Proxy) -> None:
    """Every request the server answered was forwarded by the proxy, and the proxy forwarded no other."""
    assert server.state.log, "no request reached the server"
    served = Counter((r.path, r.range) for r in server.state.log)
    forwarded = Counter((path, rng) for _, path, rng in proxy.seen)
    assert forwarded == served


@pytest.mark.parametrize("case", ["upper", "lower"])
def test_a_streamed_url_goes_through_the_proxy(tmp_path: Path, server: Server, proxy: Proxy,
                                               monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    local = make_checkpoint(tmp_path / "m.safetensors")
    server.state.files["/models/m.safetensors"] = local.read_bytes()
    _use_proxy(monkeypatch, proxy.url, case)
    streamed = wbfe.score(server.url("/models/m.safetensors"), stream=True)
    same_scores(streamed, wbfe.score(str(local)))
    _through_proxy(server, proxy)
    assert all(r.range is not None for r in server.state.log)  # range reads, one a tensor past the header
    assert len(server.state.log) == 3


@pytest.mark.parametrize("stream", [True, None])
def test_a_sharded_hub_model_goes_through_the_proxy(tmp_path: Path, server: Server, proxy: Proxy,
                                                    monkeypatch: pytest.MonkeyPatch, stream: bool | None) -> None:
    """Streamed (``--stream``) and by default (a download here: the disk has room), with
    HF_ENDPOINT naming the loopback hub: the model-info route, the index, the shards' headers and
    tensors (or the downloads), the config, and the storage host the hub redirects to."""
    folder = make_sharded(tmp_path / "sharded")
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    files["config.json"] = json.dumps({"model_type": "llama", "tie_word_embeddings": False}).encode()
    server.state.repos["org/tiny"] = Repo(files, commit="c" * 40)
    _use_proxy(monkeypatch, proxy.url, "upper")
    scored = wbfe.score("org/tiny", stream=stream)
    same_scores(scored, wbfe.score(str(folder)))
    assert scored.model.get("transport") == ("stream" if stream else None)
    _through_proxy(server, proxy)
    paths = {path for _, path, _ in proxy.seen}
    assert "/api/models/org/tiny" in paths and any(p.startswith("/lfs/") for p in paths)
    assert any(p.endswith("model.safetensors.index.json") for p in paths)


@pytest.mark.parametrize("case", ["upper", "lower"])
def test_no_proxy_names_hosts_reached_directly(tmp_path: Path, server: Server, proxy: Proxy,
                                               monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    local = make_checkpoint(tmp_path / "m.safetensors")
    server.state.files["/m.safetensors"] = local.read_bytes()
    server.state.repos["org/one"] = Repo({"model.safetensors": local.read_bytes()})
    _use_proxy(monkeypatch, proxy.url, case, no_proxy="example.org,127.0.0.1,localhost")
    same_scores(wbfe.score(server.url("/m.safetensors"), stream=True), wbfe.score(str(local)))
    same_scores(wbfe.score("org/one", stream=True), wbfe.score(str(local)))
    assert server.state.log and proxy.seen == []


@pytest.mark.parametrize("stream", [False, None])
@pytest.mark.parametrize("case", ["upper", "lower"])
def test_a_downloaded_url_goes_through_the_proxy(tmp_path: Path, server: Server, proxy: Proxy,
                                                 monkeypatch: pytest.MonkeyPatch, case: str, stream: bool | None) -> None:
    """A URL copied into the object cache (``--no-stream``, or by default: the disk has room) is fetched
    through the proxy too, and with the host in NO_PROXY directly. Before the fix fsspec's HTTP client
    (aiohttp, which reads the variables only with ``trust_env``) went around the proxy: it saw none of the
    download's requests, only the streamed reads' header requests."""
    local = make_checkpoint(tmp_path / "m.safetensors")
    server.state.files["/m.safetensors"] = local.read_bytes()
    _use_proxy(monkeypatch, proxy.url, case)
    scored = wbfe.score(server.url("/m.safetensors"), stream=stream)
    same_scores(scored, wbfe.score(str(local)))
    assert scored.model.get("transport") is None  # downloaded, not streamed
    _through_proxy(server, proxy)
    assert any(r.range is None for r in server.state.log)  # the download's whole-file GET
    seen = len(proxy.seen)
    monkeypatch.setenv("NO_PROXY" if case == "upper" else "no_proxy", "127.0.0.1,localhost")
    server.state.files["/n.safetensors"] = local.read_bytes()
    same_scores(wbfe.score(server.url("/n.safetensors"), stream=stream), wbfe.score(str(local)))
    assert len(proxy.seen) == seen and server.state.ranged("/n.safetensors")


def test_a_proxy_that_is_down_fails_the_read(tmp_path: Path, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable is obeyed, not bypassed: with the proxy down nothing reaches the server."""
    local = make_checkpoint(tmp_path / "m.safetensors")
    server.state.files["/m.safetensors"] = local.read_bytes()
    with Proxy() as gone:
        down = gone.url
    _use_proxy(monkeypatch, down, "upper")
    with pytest.raises(RemoteReadError, match=r"m\.safetensors: bytes 0-\d+ could not be read in 3 tries") as info:
        wbfe.score(server.url("/m.safetensors"), stream=True)
    assert "\n" not in str(info.value)
    assert server.state.log == []


def test_a_hub_session_that_is_not_an_httpx_client_is_one_line(tmp_path: Path, server: Server,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub before 1.0 gave a requests session: the reader says what to upgrade."""
    import huggingface_hub
    import requests

    from wbfe.errors import MissingDependencyError

    http_range.http_package.cache_clear()
    monkeypatch.setattr(huggingface_hub, "get_session", requests.Session)
    server.state.files["/m.safetensors"] = make_checkpoint(tmp_path / "m.safetensors").read_bytes()
    with pytest.raises(MissingDependencyError, match="huggingface_hub 1.0 or later"):
        wbfe.score(server.url("/m.safetensors"), stream=True)
    assert server.state.log == []
