"""The ``object-store`` location: safetensors under a ``<protocol>://`` URI streamed with ranged reads (when
asked, or larger than the free disk; a folder's ``config.json`` fetched too), anything else copied first
(:func:`~wbfe.sources.object_store.open_uri`; docs/remote.md)."""

from __future__ import annotations

from typing import Any

from wbfe.errors import InvalidOptionError
from wbfe.sources._base import TensorSource
from wbfe.sources.local import MODEL_CONFIGS, no_weight_files, pick_weight_files
from wbfe.sources.object_store import call_store, folder_files, is_uri, object_cache_dir, open_uri, store_path
from wbfe.sources.registry import register_location
from wbfe.sources.remote import is_safetensors_name, stream_safetensors
from wbfe.sources.store_range import StoreFile

__all__ = ["open_object"]


@register_location("object-store", order=20, claims=is_uri, streams=True)
def open_object(uri: str, *, stream: bool | None = None) -> TensorSource:
    """An object-store URI: its safetensors streamed, else copied and opened (``InvalidOptionError`` with
    ``stream=True`` for weights that are not safetensors, or an adapter)."""
    if stream is not False:
        source = call_store(uri, lambda fs, path, uri_: _stream(fs, path, uri_, stream))
        if source is not None:
            return source
    return open_uri(uri)


def _stream(fs: Any, path: str, uri: str, stream: bool | None) -> TensorSource | None:
    fs.invalidate_cache(path)  # what the store says now, not a listing cached by an earlier call
    info = fs.info(path)
    root = path.rstrip("/")
    if info.get("type") == "directory":
        base = uri.rstrip("/") + "/"
        top = folder_files(fs, path)
        names = sorted(top)
        chosen = pick_weight_files(names, uri)
        if not chosen:
            if stream:
                raise no_weight_files(uri)
            return None  # the copy says what is missing
        name = chosen[0]
        configs = [c for c in MODEL_CONFIGS if c in names]
        sizes = {n: int(top[n].get("size") or 0) for n in names}
        adapter = "adapter_config.json" in names
    else:
        name = root.rsplit("/", 1)[-1]
        base = uri[:len(uri) - len(name)] if uri.endswith(name) else uri.rsplit("/", 1)[0] + "/"
        root = root[:len(root) - len(name)].rstrip("/")
        configs, adapter = [], False  # a file named alone is read alone
        sizes = {name: int(info.get("size") or 0)}
    if adapter or not is_safetensors_name(name):
        if stream:
            what = "a PEFT adapter" if adapter else name
            raise InvalidOptionError(f"{uri}: --stream reads safetensors weights; this holds {what}: "
                                     "drop --stream to copy it first")
        return None

    def open_file(file_name: str) -> StoreFile:
        known = info if file_name == name and info.get("type") != "directory" else None
        return StoreFile(fs, store_path(fs, root, file_name), base + file_name, info=known)

    return stream_safetensors(uri, name, open_file, stream=stream, cache_dir=object_cache_dir(), sizes=sizes,
                              configs=configs, extra={"store": uri.split("://", 1)[0]})
