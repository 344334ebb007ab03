"""Resolve a reference and stream its tensors one at a time: the locations registered in
:mod:`wbfe.sources.registry` (an in-memory model, ``http(s)://``, an object-store URI, a local path,
``timm:``/``torchvision:``, a Hugging Face id) are tried in their declared order. Importing this package registers
them; no reader's own dependency is imported until a checkpoint needs it (docs/formats.md, docs/remote.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from wbfe.errors import InvalidOptionError, SourceNotFoundError, hub_name_hint

# The format and location modules register themselves when imported; each declares its own place.
from wbfe.sources import (  # noqa: F401
    flax_files, gguf_files, hub, keras_files, local, numpy_files, object_location, object_store,
    onnx_files, peft_adapter, remote, safetensors_files, tflite_files, torch_pickle, torchscript_files, zoo_libraries,
)
from wbfe.sources._base import (HASH_CHUNK, TORCH_SUFFIXES, Provenance, TensorEntry, TensorSource, combine_digests,
    file_sha256, missing, open_regular, stored_bytes)
from wbfe.sources._order import natural_key
from wbfe.sources.memory import MemorySource
from wbfe.sources.registry import checkpoint_suffixes, locations

# With a shard index's ``.json`` (which alone does not make a file a checkpoint).
CHECKPOINT_SUFFIXES = checkpoint_suffixes()
WEIGHT_SUFFIXES = CHECKPOINT_SUFFIXES + (".json",)

__all__ = [
    "TensorEntry", "TensorSource", "Provenance", "MemorySource", "open_source", "content_hash", "WEIGHT_SUFFIXES",
    "CHECKPOINT_SUFFIXES", "TORCH_SUFFIXES", "HASH_CHUNK", "file_sha256", "combine_digests", "open_regular",
    "natural_key", "stored_bytes", "remote_ref", "stream_each"]


def open_source(ref: Any, *, stream: bool | None = None) -> TensorSource:
    """Open ``ref`` (a path, URI, model name or id, an ``nn.Module`` or a mapping of tensors) for streaming.

    Args:
        stream: for a hub id, URL or object-store URI of safetensors: True reads them with range requests,
            False downloads (or copies) them first, None streams when they exceed the cache's free disk.

    Raises:
        SourceNotFoundError: a path that does not exist and is not a model id either.
        ModelNotFoundError: an id that cannot be resolved (unknown, or not cached while offline).
        CorruptCheckpointError, TruncatedCheckpointError, UnsafePickleError: unreadable checkpoints.
    """
    if isinstance(ref, str) and not ref.strip():
        # Path("") is the working folder: an empty argument (an unset shell variable) must not read it
        raise SourceNotFoundError("an empty model reference: name a file, folder, URI or model id", path=ref)
    for location in locations():
        if location.claims(ref):
            if location.streams:
                return location.open(ref, stream=stream)
            if stream:
                raise InvalidOptionError(f"--stream reads hub ids and http(s):// or object-store URIs; "
                                         f"{str(ref)[:200]!r} is read from its {location.name} location")
            return location.open(ref)
    if not isinstance(ref, (str, Path)):
        raise SourceNotFoundError(f"cannot read weights from a {type(ref).__name__}")
    raise missing(ref, hub_name_hint(str(ref)))


def remote_ref(ref: Any) -> bool:
    """Whether ``ref`` is read by a location that can stream it (the ones ``stream`` applies to)."""
    return any(location.streams for location in locations() if location.claims(ref))


def stream_each(refs: Sequence[Any], stream: bool | None) -> list[bool | None]:
    """The ``stream`` to open each of ``refs`` read together with: ``stream`` for the remote ones, None for
    the local ones; with ``stream=True`` and no remote one, ``stream`` for each (:func:`open_source` refuses)."""
    is_remote_each = [remote_ref(ref) for ref in refs]
    if stream and not any(is_remote_each):
        return [stream] * len(refs)
    return [stream if is_remote else None for is_remote in is_remote_each]


def content_hash(ref: Any) -> str:
    """SHA-256 of a checkpoint's weight files (what ``ModelScore.model['sha256']`` holds).

    Raises:
        The errors of :func:`open_source`; ``SourceNotFoundError`` for in-memory objects and for a
        streamed URL whose server lists no SHA-256.
    """
    with open_source(ref) as source:
        digest = source.provenance.digest()
        if digest is None:
            if source.provenance.extra.get("transport") == "stream":  # no byte hashed, none listed by the server
                raise SourceNotFoundError.at(ref, "a streamed checkpoint whose server lists no SHA-256 has no "
                                             "content hash; score it with --no-stream")
            raise SourceNotFoundError("in-memory models have no content hash")
        return digest
