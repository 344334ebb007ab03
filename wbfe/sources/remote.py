"""Safetensors read remotely, one range request a tensor, nothing written to disk: each header validated by
the local reader's code, through a :class:`~wbfe.sources.ranged.RangedFile` (HTTP or object store); by
default streamed when larger than the free disk of the cache it would be downloaded into (docs/remote.md)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import quote, urljoin, urlsplit

import numpy as np

from wbfe.errors import InvalidOptionError, RangeNotSupportedError, RemoteChangedError, SourceNotFoundError
from wbfe.linalg.arrays import from_bytes
from wbfe.sources._base import Provenance, TensorSource, combine_digests
from wbfe.sources.http_range import FIRST_READ, RemoteFile
from wbfe.sources.local import MAX_CONFIG, model_config
from wbfe.sources.object_store import NAME_A_FILE, object_cache_dir, open_uri
from wbfe.sources.ranged import RangedFile
from wbfe.sources.registry import register_location
from wbfe.sources.safetensors_files import (MAX_INDEX, ShardedSafetensors, ShardReader, header_length, parse_header,
    parse_weight_map, shard_metadata, tensor_dtype)

__all__ = ["RemoteSafetensorsSource", "stream_safetensors", "free_disk", "is_safetensors_name", "open_url"]


def is_safetensors_name(name: str) -> bool:
    return name.lower().endswith((".safetensors", ".safetensors.index.json"))


def free_disk(folder: Path) -> int:
    """Free bytes on the file system that holds ``folder`` (or its nearest existing parent)."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


class _RemoteShard:
    """The tensors of one remote shard, each fetched with one range request (none within the first read)."""

    def __init__(self, remote: RangedFile, data_start: int, head: bytes):
        self.remote = remote
        self._data_start = data_start
        self._head = head

    def read(self, info: dict[str, Any]) -> Any:
        dtype = tensor_dtype(info, self.remote.name)
        start, end = (self._data_start + int(o) for o in info["data_offsets"])
        # np.empty, not bytearray: no zero-fill pass over bytes about to be overwritten.
        raw = np.empty(end - start, dtype=np.uint8)
        view = raw.data
        have = max(0, min(end, len(self._head)) - start)  # what the first read already holds
        view[:have] = self._head[start:start + have]
        if have < end - start:
            self.remote.read_into(start + have, view[have:])
        return from_bytes(raw, dtype, [int(s) for s in info["shape"]])

    def close(self) -> None:
        self.remote.close()


class RemoteSafetensorsSource(ShardedSafetensors):
    def __init__(self, ref: str,
                 shards: list[tuple[RangedFile, str, list[str] | None, dict[str, dict[str, Any]], int, bytes]],
                 *, index: RangedFile | None, index_name: str, fmt: str | None, metadata: dict[str, Any],
                 digests: Mapping[str, str] | None, extra: Mapping[str, Any] | None):
        self._starts = {id(remote): (data_start, head) for remote, _, _, _, data_start, head in shards}
        self.remotes = ([index] if index is not None else []) + [remote for remote, *_ in shards]
        self.plan([(remote, name, listed, header) for remote, name, listed, header, *_ in shards], index_name)
        known = [(name, digests.get(name)) for _, name, *_ in shards] if digests else []
        sha256 = combine_digests([(n, d) for n, d in known if d]) if known and all(d for _, d in known) else None
        self.provenance = Provenance(
            source=ref, format=fmt or ("safetensors-sharded" if index is not None else "safetensors"),
            files=[remote.url for remote in self.remotes], sha256=sha256,
            extra={**({"metadata": metadata} if metadata else {}), "transport": "stream",
                   "etags": {remote.url: remote.identity for remote in self.remotes}, **dict(extra or {})})

    def open_shard(self, key: Any) -> ShardReader:
        return _RemoteShard(key, *self._starts[id(key)])

    def fetched(self) -> dict[str, int]:
        """What was fetched so far: ``requests``, ``bytes`` (retries included) and the files' ``size`` in all."""
        return {"requests": sum(r.requests for r in self.remotes), "bytes": sum(r.bytes_fetched for r in self.remotes),
                "size": sum(r.size or 0 for r in self.remotes)}

    def close(self) -> None:
        super().close()
        for remote in self.remotes:
            remote.close()


def stream_safetensors(ref: str, name: str, open_file: Callable[[str], RangedFile], *, stream: bool | None,
                       cache_dir: Path, sizes: Mapping[str, int] | None = None,
                       digests: Mapping[str, str] | None = None, commit: str | None = None, fmt: str | None = None,
                       configs: Iterable[str] = (), extra: Mapping[str, Any] | None = None
                       ) -> RemoteSafetensorsSource | None:
    """Open the remote safetensors file (or shard index) ``name`` for streaming.

    Args:
        name: the weight file's name; shards are named relative to it; ``open_file`` opens a file by name.
        stream: None streams the checkpoint only when larger than the free disk of ``cache_dir``, else returns
            None (after fetching the index alone when ``sizes`` has every shard's size), as it does for a server
            that ignores ranges; True streams it or raises.
        sizes, digests: each file's size and SHA-256 where the server lists them (the hub does).
        commit: the commit every answer must come from (a hub ``X-Repo-Commit``), when known.
        configs: the small files beside it that hold the model config (read as a local folder's are).

    Raises:
        RemoteReadError, RangeNotSupportedError, RemoteChangedError: the transport's errors.
        CorruptCheckpointError, TruncatedCheckpointError: an index or header that is not valid.
    """
    decide = stream is None  # by the free disk, once the checkpoint's size is known
    try:
        with contextlib.ExitStack() as opened:  # the files opened, closed unless a source takes them
            index: RangedFile | None = None
            folder = name[:name.rfind("/") + 1]  # where the index's shard names start from
            if name.lower().endswith(".index.json"):
                index = open_file(name)
                opened.callback(index.close)
                planned = list(parse_weight_map(index.read_all(MAX_INDEX), index.name).items())
                _check_commit(index, commit)
                shard_names: list[tuple[str, list[str] | None]] = [(folder + shard, names) for shard, names in planned]
            else:
                shard_names = [(name, None)]
            if decide and sizes is not None and all(n in sizes for n, _ in shard_names):
                if sum(sizes[n] for n, _ in shard_names) <= free_disk(cache_dir):
                    return None
                decide = False
            shards = []
            metas: list[tuple[str, dict[str, str]]] = []
            for shard_name, listed in shard_names:
                file = open_file(shard_name)
                opened.callback(file.close)
                head = file.head(FIRST_READ)
                size = file.size or 0
                n = header_length(head[:8], size, file.name)
                raw = head[8:8 + n]
                if len(raw) < n:  # a header longer than the first read: one more request
                    raw += file.read_bytes(len(head), 8 + n - len(head))
                header, meta = parse_header(raw, size, file.name)
                _check_commit(file, commit)
                # named as the index names it (two shards in subfolders may share a file name)
                named = shard_name[len(folder):] if index is not None else shard_name.rsplit("/", 1)[-1]
                metas.append((named, meta))
                shards.append((file, named, listed, header, 8 + n, head))
            if decide and sum(file.size or 0 for file, *_ in shards) <= free_disk(cache_dir):
                return None
            source = RemoteSafetensorsSource(ref, shards, index=index, fmt=fmt, metadata=shard_metadata(metas),
                                             digests=digests, index_name=name.rsplit("/", 1)[-1] if index else "",
                                             extra=extra)
            opened.pop_all()  # the source closes them now
            source.config = model_config(lambda config: open_file(config).read_all(MAX_CONFIG), list(configs))
            return source
    except RangeNotSupportedError:
        if stream:
            raise
        return None  # by default a server without ranges means a download, as before


def _check_commit(file: RangedFile, commit: str | None) -> None:
    if commit is not None and file.commit is not None and file.commit != commit:
        raise RemoteChangedError.at(file.name, f"served from commit {file.commit}, not {commit}: the repository "
                                    "changed while it was read; score it again")


@register_location("http", order=15, streams=True,
                   claims=lambda ref: isinstance(ref, str) and ref.lower().startswith(("http://", "https://")))
def open_url(url: str, *, stream: bool | None = None) -> TensorSource:
    """An ``http(s)://`` URL: safetensors streamed, anything else (or with ``stream=False``) copied first.

    Raises:
        SourceNotFoundError: a URL of a folder (``http://host/llama/``), or a web page.
        InvalidOptionError: ``stream=True`` for a URL that names no safetensors file.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 host, a bad port...
        raise SourceNotFoundError.at(url, f"not a valid URL ({exc})") from None
    name = parts.path.rsplit("/", 1)[-1]
    if not name:  # an HTTP server has no folder listing wbfe could read, only a web page
        raise SourceNotFoundError.at(url, f"a URL of a folder; {NAME_A_FILE}")
    if stream and not is_safetensors_name(name):
        raise InvalidOptionError(f"{url}: --stream reads .safetensors files and .safetensors.index.json shard "
                                 "indexes only; drop --stream to download it")
    if stream is False or not is_safetensors_name(name):
        return open_uri(url)

    def open_file(file_name: str) -> RemoteFile:
        # Quoted: a shard named "a#1", "b?x" or "https:host/c" is a file beside the index, never another URL. The
        # index's query (a signature, a token) goes with it, as a browser would not: it signs the checkpoint's files.
        beside = urljoin(url, quote(file_name))
        return RemoteFile(url if file_name == name else f"{beside}?{parts.query}" if parts.query else beside)

    source = stream_safetensors(url, name, open_file, stream=stream, cache_dir=object_cache_dir())
    return source if source is not None else open_uri(url)
