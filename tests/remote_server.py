"""A loopback HTTP server for the remote-streaming tests: files served with HTTP ranges (RFC 9110),
a fake Hugging Face endpoint (the model-info and resolve routes, LFS files redirected as the hub
does), a log of every request, and faults injected on demand."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Request:
    path: str
    range: str | None
    status: int
    sent: int  # body bytes written
    auth: str | None = None  # the Authorization header received


@dataclass
class Repo:
    """A hub repository: its files at one commit (a new commit replaces them)."""

    files: dict[str, bytes]
    commit: str = "a" * 40
    pushed: Repo | None = None  # the next commit, pushed as the first file request is answered
    older: dict[str, dict[str, bytes]] = field(default_factory=dict)  # earlier commits' files, served by hash

    def at(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        """The commit and files ``revision`` names (``main``, a commit), None if none."""
        if revision in ("main", self.commit):
            return self.commit, self.files
        return (revision, self.older[revision]) if revision in self.older else None


@dataclass
class State:
    files: dict[str, bytes] = field(default_factory=dict)  # URL path -> bytes
    repos: dict[str, Repo] = field(default_factory=dict)  # "org/name" -> repo
    types: dict[str, str] = field(default_factory=dict)  # URL path -> its Content-Type, where one is sent
    ignore_range: bool = False
    honour_if_match: bool = True
    token: str | None = None  # the hub's resolve route wants "Bearer <token>" when set
    query: str | None = None  # a plain file is refused (403) unless asked for with this query (a signed URL)
    no_sha: bool = False  # the model-info route names no commit (a mirror's answer)
    validators: bool = True  # False: no ETag is sent (nor Last-Modified, unless last_modified names one)
    last_modified: dict[str, str] = field(default_factory=dict)  # URL path -> its Last-Modified, where one is sent
    # (path substring, fault) pairs, each used once by the first request whose path holds it; a
    # fault ending in "!" stays (every such request meets it).
    faults: list[tuple[str, str]] = field(default_factory=list)
    log: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fault_for(self, path: str) -> str | None:
        with self.lock:
            for i, (where, fault) in enumerate(self.faults):
                if where in path:
                    if not fault.endswith("!"):
                        del self.faults[i]
                    return fault.rstrip("!")
        return None

    def ranged(self, where: str = "") -> list[Request]:
        """Answered requests (any status) for paths holding ``where``."""
        return [r for r in self.log if where in r.path]


def etag_of(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest() + '"'


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    head_only = False

    def do_HEAD(self) -> None:  # noqa: N802 - the http.server name
        self.head_only = True
        try:
            self.do_GET()
        finally:
            self.head_only = False

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        path = unquote(urlsplit(self.path).path)
        fault = self.state.fault_for(path)
        if fault is not None and fault.startswith("status:"):
            parts = fault.split(":")  # status:429 or status:429:<Retry-After seconds>
            status = int(parts[1])
            extra = {"Retry-After": parts[2] if len(parts) > 2 else "0"} if status in (429, 503) else {}
            return self._plain(path, status, b"injected", extra)
        if path.startswith("/api/models/"):
            return self._model_info(path[len("/api/models/"):])
        match = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if match:
            return self._resolve(path, *match.groups())
        if path.startswith("/lfs/"):
            sha = path[len("/lfs/"):]
            for repo in self.state.repos.values():
                for data in [d for files in (repo.files, *repo.older.values()) for d in files.values()]:
                    if hashlib.sha256(data).hexdigest() == sha:
                        return self._serve(path, data, fault)
            return self._plain(path, 404, b"no such blob")
        query = urlsplit(self.path).query  # "/f?file=a" in files: a file the query selects
        data = self.state.files.get(f"{path}?{query}", self.state.files.get(path))
        if self.state.query is not None and query != self.state.query:
            return self._plain(path, 403, b"signature missing")
        if data is None:
            return self._plain(path, 404, b"not found")
        if fault == "change":  # a new version of the file from this request on
            data = self.state.files[path] = data[:-4] + bytes(4)
            fault = None
        return self._serve(path, data, fault)

    # ---------------------------------------------------------------- hub routes

    def _model_info(self, rest: str) -> None:
        parts = rest.split("/")
        repo_id = "/".join(parts[:2])
        repo = self.state.repos.get(repo_id)
        if repo is None or (len(parts) > 2 and parts[2] not in ("revision", "tree")):
            return self._plain("/api/models/" + rest, 404, b'{"error": "Repository not found"}',
                               {"X-Error-Code": "RepoNotFound"})
        if len(parts) > 3 and parts[2] == "tree":  # the file listing (list_repo_files)
            files = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                     for name, data in sorted(repo.files.items())]
            return self._plain("/api/models/" + rest, 200, json.dumps(files).encode(),
                               {"Content-Type": "application/json"})
        served = repo.at(parts[3] if len(parts) > 3 else "main")
        if served is None:
            return self._plain("/api/models/" + rest, 404, b'{"error": "Invalid rev id"}',
                               {"X-Error-Code": "RevisionNotFound"})
        siblings = []
        for name, data in sorted(served[1].items()):
            entry: dict[str, Any] = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
            if name.endswith(".safetensors"):
                entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(entry)
        body = json.dumps({"id": repo_id, "modelId": repo_id, "private": False, "siblings": siblings,
                           **({} if self.state.no_sha else {"sha": served[0]})}).encode()
        self._plain("/api/models/" + rest, 200, body, {"Content-Type": "application/json"})

    def _resolve(self, path: str, repo_id: str, revision: str, name: str) -> None:
        repo = self.state.repos.get(repo_id)
        if self.state.token is not None and self.headers.get("Authorization") != f"Bearer {self.state.token}":
            return self._plain(path, 401, b"unauthorized", {"X-Error-Code": "GatedRepo"})
        served = repo.at(revision) if repo is not None else None
        if repo is None or served is None or name not in served[1]:
            return self._plain(path, 404, b"not found", {"X-Error-Code": "EntryNotFound"})
        commit, data = served[0], served[1][name]
        if repo.pushed is not None:  # a push: this answer is of the old commit, later ones of main see the new
            repo.older[repo.commit] = repo.files
            repo.files, repo.commit, repo.pushed = repo.pushed.files, repo.pushed.commit, None
        fault = self.state.fault_for(path + "#commit")
        headers = {"X-Repo-Commit": "b" * 40 if fault == "commit" else commit}
        if name.endswith(".safetensors"):  # LFS: the hub redirects to its storage
            sha = hashlib.sha256(data).hexdigest()
            # On another host, as the hub's storage is: a client must not send the token there.
            storage = f"http://localhost:{self.server.server_address[1]}"
            headers.update({"Location": f"{storage}/lfs/{sha}", "X-Linked-Etag": f'"{sha}"',
                            "X-Linked-Size": str(len(data)), "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})
            return self._plain(path, 302, b"", headers)
        return self._serve(path, data, None, headers)

    # ---------------------------------------------------------------- bodies

    def _plain(self, path: str, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        # Logged before the answer goes out: the client may act on it before this thread runs again.
        self._log(path, status, 0 if self.head_only else len(body))
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not self.head_only:
            self.wfile.write(body)

    def _log(self, path: str, status: int, sent: int) -> Request:
        request = Request(path, self.headers.get("Range"), status, sent, self.headers.get("Authorization"))
        with self.state.lock:
            self.state.log.append(request)
        return request

    def _serve(self, path: str, data: bytes, fault: str | None, headers: dict[str, str] | None = None) -> None:
        etag = etag_of(data)
        base = {"ETag": etag, "Accept-Ranges": "bytes", **(headers or {})}
        if not self.state.validators:
            del base["ETag"]
        if path in self.state.last_modified:
            base["Last-Modified"] = self.state.last_modified[path]
        if path in self.state.types:
            base["Content-Type"] = self.state.types[path]
        match = _RANGE.match(self.headers.get("Range") or "")
        if self.head_only or self.state.ignore_range or fault == "ignore_range" or match is None:
            return self._plain(path, 200, data, base)
        if_match = self.headers.get("If-Match")
        if self.state.honour_if_match and if_match is not None and if_match != etag:
            return self._plain(path, 412, b"precondition failed", base)
        first = int(match.group(1))
        last = min(int(match.group(2)) if match.group(2) else len(data) - 1, len(data) - 1)
        if first >= len(data):
            return self._plain(path, 416, b"", {**base, "Content-Range": f"bytes */{len(data)}"})
        body = data[first:last + 1]
        shown = (first, last)
        if fault == "bad_range":  # the bytes one further on, labelled as such
            body = data[first + 1:last + 2]
            shown = (first + 1, first + len(body))
        if fault == "gzip":  # compressed although the client asked for identity
            body = gzip.compress(body)
            base["Content-Encoding"] = "gzip"
        length = len(body) - 10 if fault == "short" else len(body)
        logged = self._log(path, 206, 0)  # before the answer: see _plain
        self.send_response(206)
        for key, value in base.items():
            self.send_header(key, value)
        self.send_header("Content-Range", f"bytes {shown[0]}-{shown[1]}/{len(data)}")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        try:
            if fault == "drop":  # half the body, then the connection is cut
                logged.sent = len(body) // 2
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
            elif fault == "stall":  # the headers, then nothing for longer than a client's read timeout
                time.sleep(1.5)
                self.close_connection = True
            elif fault == "trickle":
                for i in range(0, len(body), 256):
                    logged.sent += len(body[i:i + 256])
                    self.wfile.write(body[i:i + 256])
                    self.wfile.flush()
                    time.sleep(0.02)
            else:
                logged.sent = length
                self.wfile.write(body[:length])
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that drops a connection (as the fault tests make it) is no server error


class Server:
    """``with Server() as s``: ``s.url(path)``, ``s.endpoint`` (for HF_ENDPOINT), ``s.state``."""

    def __init__(self) -> None:
        self.state = State()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.httpd = _Quiet(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return self.endpoint + path

    def __enter__(self) -> "Server":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve() -> Iterator[Server]:
    """A pytest fixture body: a running server, stopped after the test."""
    with Server() as server:
        yield server


def go_online(monkeypatch: Any) -> None:
    """Lift the tests' offline mode for a loopback hub: the variable, and huggingface_hub's copy of it,
    which it reads once at import (an earlier test may have imported it while offline)."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def isolated_hub(monkeypatch: Any, tmp_path: Any) -> None:
    """Empty wbfe and huggingface_hub caches under ``tmp_path``, and the hub reachable (see :func:`go_online`)."""
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "wbfe-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    go_online(monkeypatch)
