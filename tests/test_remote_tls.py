"""A CA bundle named by the environment is what a streamed read trusts (issue #45 §7): against a
loopback HTTPS server whose certificate is self-signed (made here with the openssl tool), a
streamed score is refused in one line that names ``SSL_CERT_FILE`` (once: a certificate is not
retried), and with ``SSL_CERT_FILE`` naming the certificate it equals the local file's score."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import wbfe
from tests.remote_server import Server
from tests.test_remote_stream import make_checkpoint, same_scores
from wbfe.errors import RemoteReadError
from wbfe.sources import http_range
from wbfe.sources.http_range import RetryPolicy


@pytest.fixture()
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl tool makes the test's certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "HTTPS_PROXY", "https_proxy",
                 "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "wbfe-cache"))
    monkeypatch.setattr(http_range, "DEFAULT_POLICY", RetryPolicy(attempts=3, backoff=0.001, backoff_max=0.01,
                                                                  timeout=5.0))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    srv = Server()
    srv.httpd.socket = context.wrap_socket(srv.httpd.socket, server_side=True)
    with srv:
        yield srv, cert


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_the_ca_bundle_of_ssl_cert_file_is_trusted(tmp_path: Path, tls_server: tuple[Server, Path],
                                                   monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    server, cert = tls_server
    local = make_checkpoint(tmp_path / "m.safetensors")
    server.state.files["/m.safetensors"] = local.read_bytes()
    url = server.url("/m.safetensors").replace("http://", "https://")
    with pytest.raises(RemoteReadError, match=r"m\.safetensors: the server's TLS certificate is not trusted "
                                              r"\(.*\); point SSL_CERT_FILE at the CA bundle") as info:
        wbfe.score(url, stream=True)
    assert "\n" not in str(info.value) and server.state.log == []
    monkeypatch.setenv(variable, str(cert))
    same_scores(wbfe.score(url, stream=True), wbfe.score(str(local)))
    assert len(server.state.log) == 3
