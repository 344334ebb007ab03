"""Object-store URIs (``s3://bucket/model/``, any ``<protocol>://`` fsspec knows): the copy into a
content-addressed cache folder (docs/remote.md), and the store access it shares with the streamed reads
(:mod:`wbfe.sources.object_location`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

from wbfe._config import wbfe_cache_dir
from wbfe.errors import CorruptCheckpointError, MissingDependencyError, SourceNotFoundError, WbfeError
from wbfe.sources._base import TensorSource
from wbfe.sources.http_range import said
from wbfe.sources.local import MODEL_CONFIGS, no_weight_files, open_path, pick_weight_files
from wbfe.sources.object_bound import evict_objects, object_cache_bound
from wbfe.sources.resay import resaying, said_of
from wbfe.sources.safetensors_files import MAX_INDEX, index_weight_map, parse_weight_map

__all__ = ["URI", "is_uri", "open_uri", "fetch_uri", "uri_signature", "object_cache_dir", "FSSPEC_INSTALL",
           "store_filesystem", "object_identity", "call_store", "folder_files", "store_path"]

URI = re.compile(r"^(?P<protocol>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$", re.S)
FSSPEC_INSTALL = "pip install 'wbfe[fsspec]'"

# What stores report of an object that changes when its content does (s3: ETag, LastModified; gcs:
# md5Hash, generation, updated; local and memory: mtime / created; hf://: blob_id; http(s):// the headers).
# Size is always compared.
_IDENTITY = ("size", "ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "last_modified",
             "updated", "created", "ino", "version_id", "VersionId", "blob_id", "Last-Modified", "Content-MD5",
             "Digest")
# What a server sends of a file's content: an HTTP URL's copy is found again by these without its query (a
# presigned URL signs anew each time). Last-Modified is no such mark: two files a query selects at one path may
# share a size and a second.
_CONTENT_MARKS = frozenset(("ETag", "Content-MD5", "Digest"))
NAME_A_FILE = ("name a checkpoint file or a shard index in it, e.g. .../model.safetensors or "
               ".../model.safetensors.index.json")


def is_uri(text: Any) -> bool:
    """Whether ``text`` is a ``<protocol>://...`` string (``s3://``, ``memory://``; a Windows drive ``C:\\`` is not)."""
    return isinstance(text, str) and URI.match(text) is not None


def object_cache_dir() -> Path:
    return wbfe_cache_dir() / "objects"


def open_uri(uri: str) -> TensorSource:
    """Copy the object ``uri`` names into the local cache (when not there already) and open it.

    Raises:
        MissingDependencyError: fsspec, or the protocol's package (e.g. s3fs), is not installed.
        SourceNotFoundError: an unknown protocol, a missing object, a folder without weight files,
            or a store that cannot be read.
        CorruptCheckpointError, TruncatedCheckpointError, ...: as the readers raise for the copy.
    """
    local, fresh = call_store(uri, _fetch)
    # Errors name the copy's files by the URI's, never the cache folder the user did not name.
    root, ref = (local, uri) if local.is_dir() else (local.parent, uri.rstrip("/").rsplit("/", 1)[0])
    source = resaying(said_of(root, ref, lambda: open_path(local, ref=uri)), root, ref)
    if fresh:
        source.provenance.extra["copy"] = ("downloaded again: the server reports nothing of it but its size (no ETag, "
                                           "hash, time or version), so an earlier copy could be another file")
    return source


def store_filesystem(uri: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``uri`` and the path in it (``MissingDependencyError``, ``SourceNotFoundError``)."""
    try:
        import fsspec
    except ModuleNotFoundError:
        raise MissingDependencyError(f"{uri}: object-store URIs need fsspec: {FSSPEC_INSTALL}") from None
    protocol = uri.split("://", 1)[0]
    # aiohttp reads HTTP(S)_PROXY and NO_PROXY only when told to: a download goes where the streamed reads go; a
    # query (a signature) is sent as given, where yarl would decode its %2F
    options = {"client_kwargs": {"trust_env": True}, "encoded": "?" in uri} if protocol.lower() in ("http", "https") else {}
    try:
        fs, path = fsspec.core.url_to_fs(uri, **options)
    except ImportError as exc:  # a known protocol whose package (s3fs, gcsfs, ...) is missing
        from fsspec.registry import known_implementations

        package = known_implementations.get(protocol, {}).get("class", "").split(".")[0]
        hint = f"pip install {package}" if package else " ".join(str(exc).split())
        raise MissingDependencyError(f"{uri}: the {protocol}:// protocol needs {package or 'a package'}: "
                                     f"{hint}") from None
    except (ValueError, TypeError) as exc:
        raise SourceNotFoundError.at(uri, f"unknown protocol {protocol!r} ({' '.join(str(exc).split())})") from None
    except Exception as exc:  # noqa: BLE001 - a filesystem that connects as it is made (ftp://, sftp://) and cannot
        raise SourceNotFoundError.at(uri, f"cannot reach the store ({said(exc, 300)})") from None
    return fs, str(path)


def object_identity(info: Mapping[str, Any]) -> dict[str, str]:
    """What ``fs.info`` says of an object that changes when its content does (see ``_IDENTITY``)."""
    return {k: str(info[k]) for k in _IDENTITY if info.get(k) is not None}


def folder_files(fs: Any, path: str) -> dict[str, Any]:
    """What ``fs.ls`` says of each file directly in the folder ``path``, by name."""
    root = path.rstrip("/")
    named = ((e["name"].rstrip("/")[len(root):].lstrip("/"), e) for e in fs.ls(path, detail=True))
    return {name: e for name, e in named if name and "/" not in name and e.get("type") == "file"}


def store_path(fs: Any, root: str, name: str) -> str:
    """The path of the file ``name`` in the store's folder ``root``, quoted where the store's paths are URLs (a
    file named "a#1" or "b?x" is a file, not a fragment or a query)."""
    return f"{root}/{quote(name) if 'http' in fs.protocol else name}"


def _beside(fs: Any, path: str, name: str) -> str:
    """The path of the file ``name`` in the folder of the file ``path``, with an HTTP URL's query (as the streamed
    reads send it, docs/remote.md)."""
    path, mark, query = path.partition("?") if "http" in fs.protocol else (path, "", "")
    return store_path(fs, path.rstrip("/").rsplit("/", 1)[0], name) + mark + query


def fetch_uri(uri: str) -> Path:
    """The local copy of ``uri``: a file, or a folder of the files the URI's folder holds that count."""
    return call_store(uri, _fetch)[0]


def uri_signature(uri: str) -> str:
    """A SHA-256 of ``uri`` and what the store says of its objects (sizes, ETags, times), without a download; a
    new one each call where an object is known by its size alone (a score keyed by it is never reused)."""
    key, _, signature, _ = call_store(uri, _describe)
    return key + secrets.token_hex(8) if _unvalidated(signature) else key


def call_store(uri: str, action: Any) -> Any:
    """``action(fs, path, uri)``, its store failures turned into one-line typed errors."""
    fs, path = store_filesystem(uri)
    try:
        return action(fs, path, uri)
    except WbfeError:
        raise
    except FileNotFoundError:
        raise SourceNotFoundError(f"no such object: {uri}", path=uri) from None
    except Exception as exc:  # noqa: BLE001 - any store failure (permissions, network) is "cannot read"
        raise SourceNotFoundError.at(uri, f"cannot read ({said(exc, 300)})") from None


def _describe(fs: Any, path: str, uri: str) -> tuple[str, dict[str, Any], Any, dict[str, Any]]:
    """(content key, the object's info, its signature, a folder's top-level files by name)."""
    fs.invalidate_cache(path)  # what the store says now: s3fs answers info and ls from listings it cached before
    info = fs.info(path)
    top: dict[str, Any] = {}
    if info.get("type") == "directory":
        top = folder_files(fs, path)
        signature: Any = sorted([name, object_identity(e)] for name, e in top.items())
        signature += _subfolder_shards(fs, path, uri, top)
    else:
        name = (path.partition("?")[0] if "http" in fs.protocol else path).rstrip("/").rsplit("/", 1)[-1]
        if not name:
            raise SourceNotFoundError.at(uri, "names neither a file nor a folder")
        if str(info.get("mimetype", "")).lower() == "text/html":
            # A web server's folder listing (or an error page served as 200): never a checkpoint.
            raise SourceNotFoundError.at(uri, f"the server answers with a web page, not a checkpoint; {NAME_A_FILE}")
        signature = [name, object_identity(info)]
        if name.lower().endswith(".index.json"):
            # The shards are part of the checkpoint: a shard re-uploaded under an unchanged index
            # (a retrained model of the same layout) must not be served from the old copy.
            signature.append(sorted([shard, object_identity(shard_info)]
                                    for shard, shard_info in _index_shards(fs, path, uri, info).items()))
    if "http" in fs.protocol and all(identity.keys() & _CONTENT_MARKS for identity in _identities(signature)):
        uri = uri.partition("?")[0]
    key = hashlib.sha256(json.dumps({"uri": uri, "objects": signature}, sort_keys=True).encode()).hexdigest()
    return key, info, signature, top


def _identities(signature: Any) -> list[dict[str, str]]:
    """Every object's identity in a signature (of a file, its shards, a folder's files)."""
    if isinstance(signature, dict):
        return [signature]
    return [i for part in signature for i in _identities(part)] if isinstance(signature, list) else []


def _unvalidated(signature: Any) -> bool:
    """Whether some object is known by its size alone: a copy of it could be another file of that size."""
    return any(set(identity) <= {"size"} for identity in _identities(signature))


def _subfolder_shards(fs: Any, path: str, uri: str, top: dict[str, Any]) -> list[Any]:
    """``[[shard, identity]...]`` of the shards in subfolders that the index of the folder ``path`` lists (a shard
    re-uploaded there makes a new copy, as a top-level file does); ``[]`` where there is none (no index is read
    then: a folder without subfolders has none)."""
    try:
        index = next((n for n in pick_weight_files(sorted(top)) if n.lower().endswith(".index.json")), None)
    except CorruptCheckpointError:  # several weight files: the copy says so
        return []
    if index is None or not any(e.get("type") == "directory" for e in fs.ls(path, detail=True)):
        return []
    shards = _index_shards(fs, store_path(fs, path.rstrip("/"), index), f"{uri.rstrip('/')}/{index}", top[index])
    below = sorted([shard, object_identity(e)] for shard, e in shards.items() if shard not in top)
    return [below] if below else []


def _fetch(fs: Any, path: str, uri: str) -> tuple[Path, bool]:
    """(the copy, whether it was fetched anew because an object is known by its size alone)."""
    bound = object_cache_bound()  # a bad $WBFE_CACHE_MAX_SIZE is refused before anything is fetched
    key, info, signature, top = _describe(fs, path, uri)
    final = object_cache_dir() / key[:2] / key
    named = final / signature[0] if info.get("type") != "directory" else final
    fresh = _unvalidated(signature)
    if final.is_dir() and not fresh:
        # Marked used: `wbfe cache prune` removes the least recently used copies first, and reading
        # a file moves its access time at most once a day (relatime).
        with contextlib.suppress(OSError):
            os.utime(final)
        return named, fresh
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.is_dir():  # a copy of an object known by its size alone: replaced, never reused
        old = final.parent / f".{key}.{secrets.token_hex(6)}.part"
        with contextlib.suppress(OSError):  # another process may have moved it first
            final.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    staging = final.parent / f".{key}.{secrets.token_hex(6)}.part"
    staging.mkdir()
    try:
        if info.get("type") == "directory":
            said_of(staging, uri, lambda: _fetch_folder(fs, path, uri, sorted(top), staging))
        else:
            fs.get_file(path, str(staging / signature[0]))
            if len(signature) > 2:  # a shard index: its shards beside it, as in the store
                said_of(staging, uri.rstrip("/").rsplit("/", 1)[0],
                        lambda: _fetch_shards(fs, path, staging / signature[0], staging, uri))
        try:
            os.rename(staging, final)
        except OSError:  # another process put the same copy there first: use theirs
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    # The copies grow by a checkpoint each time: keep them within the bound, never evicting this one.
    evict_objects(object_cache_dir(), keep=final, bound=bound)
    return named, fresh


def _fetch_folder(fs: Any, path: str, uri: str, names: list[str], staging: Path) -> None:
    root = path.rstrip("/")
    chosen = pick_weight_files(names, uri)
    if not chosen:
        raise no_weight_files(uri)
    for name in chosen + [c for c in MODEL_CONFIGS + ("adapter_config.json",) if c in names]:
        fs.get_file(store_path(fs, root, name), str(staging / name))
    if chosen[0].endswith(".index.json"):  # the shards it lists (names checked to stay in the folder)
        _fetch_shards(fs, store_path(fs, root, chosen[0]), staging / chosen[0], staging,
                      f"{uri.rstrip('/')}/{chosen[0]}")


def _fetch_shards(fs: Any, index_path: str, index: Path, staging: Path, index_uri: str) -> None:
    for shard in index_weight_map(index):  # names checked to stay in the folder
        target = staging / shard
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            fs.get_file(_beside(fs, index_path, shard), str(target))
        except FileNotFoundError:  # the folder is there: the shard is what is missing
            raise _missing_shard(index_uri, shard) from None


def _index_shards(fs: Any, path: str, uri: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """What the store says of each shard the index at ``path`` lists, by shard name."""
    size = info.get("size")
    if isinstance(size, int) and size > MAX_INDEX:
        raise CorruptCheckpointError.at(uri, f"shard index larger than {MAX_INDEX} bytes")
    shards = parse_weight_map(fs.cat_file(path), uri)
    found: dict[str, Any] = {}
    for shard in shards:
        try:
            found[shard] = fs.info(_beside(fs, path, shard))
        except FileNotFoundError:
            raise _missing_shard(uri, shard) from None
    return found


def _missing_shard(index_uri: str, shard: str) -> SourceNotFoundError:
    return SourceNotFoundError.at(index_uri, f"shard {shard!r} listed in the index is missing from the store "
                                  f"(no {index_uri.rsplit('/', 1)[0]}/{shard})")
