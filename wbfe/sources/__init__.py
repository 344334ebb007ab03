"""Resolve a reference and stream its tensors one at a time.

References, tried in this order:

- an ``nn.Module`` or a mapping of tensors (library use);
- an existing path: a ``.safetensors`` file, a ``*.index.json`` shard index, a PyTorch file
  (``.bin .pt .pth .th .ckpt``, loaded with ``weights_only=True``), or a folder holding one of these;
- an object-store URI ``<protocol>://...`` (``s3://``, ``gs://``, ... through fsspec), copied
  into a local cache first (:mod:`wbfe.sources.object_store`);
- ``timm:<name>`` and ``torchvision:<weights>``;
- a Hugging Face id ``org/name[@revision]``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from wbfe.errors import SourceNotFoundError
from wbfe.sources._base import TORCH_SUFFIXES, Provenance, TensorEntry, TensorSource
from wbfe.sources.formats import OTHER_SUFFIXES
from wbfe.sources.hub import HUB_ID
from wbfe.sources.object_store import is_uri
from wbfe.sources.torch_pickle import tensor_entries, unwrap_state_dict

# The one list of suffixes a checkpoint file of any format wbfe reads may have, and with a shard
# index's ``.json`` (which alone does not make a file a checkpoint).
CHECKPOINT_SUFFIXES = (".safetensors",) + TORCH_SUFFIXES + OTHER_SUFFIXES
WEIGHT_SUFFIXES = CHECKPOINT_SUFFIXES + (".json",)

__all__ = [
    "TensorEntry", "TensorSource", "Provenance", "open_source", "content_hash", "WEIGHT_SUFFIXES", "CHECKPOINT_SUFFIXES",
    "TORCH_SUFFIXES",
]


class MemorySource(TensorSource):
    """An in-memory ``nn.Module`` or state dict (tied parameters detected by shared storage)."""

    headers_only = True

    def __init__(self, obj: Any):
        state = obj.state_dict() if hasattr(obj, "state_dict") and callable(obj.state_dict) else obj
        self._state = unwrap_state_dict(state, where=type(obj).__name__)
        self.provenance = Provenance(
            source=f"<{type(obj).__name__}>", format="module" if state is not obj else "state_dict"
        )

    def __len__(self) -> int:
        return len(self._state)

    def entries(self) -> Iterator[TensorEntry]:
        return tensor_entries(self._state)


def open_source(ref: Any) -> TensorSource:
    """Open ``ref`` for streaming (see the module docstring for what a reference can be).

    Raises:
        SourceNotFoundError: a path that does not exist and is not a model id either.
        ModelNotFoundError: an id that cannot be resolved (unknown, or not cached while offline).
        CorruptCheckpointError, TruncatedCheckpointError, UnsafePickleError: unreadable checkpoints.
    """
    if not isinstance(ref, (str, Path)):
        if isinstance(ref, Mapping) or hasattr(ref, "state_dict"):
            return MemorySource(ref)
        raise SourceNotFoundError(f"cannot read weights from a {type(ref).__name__}")
    text = str(ref)
    if isinstance(ref, str) and is_uri(text):  # s3://, gs://, memory://, file://: through fsspec
        from wbfe.sources.object_store import open_uri

        return open_uri(text)
    path = Path(text).expanduser()
    if os.path.lexists(path):  # a dangling symlink too: open_path says what it is
        from wbfe.sources.local import open_path

        return open_path(path, ref=text)
    for prefix, opener in (("timm:", "open_timm"), ("torchvision:", "open_torchvision")):
        if text.startswith(prefix):
            from wbfe.sources import zoo_libraries

            return getattr(zoo_libraries, opener)(text[len(prefix):], ref=text)
    if HUB_ID.match(text) and not text.startswith((".", "/", "~")) and not text.endswith(WEIGHT_SUFFIXES):
        from wbfe.sources.hub import open_hub

        return open_hub(text, could_be_path=True)
    raise SourceNotFoundError(f"no such file or folder: {text}", path=text)


def content_hash(ref: Any) -> str:
    """SHA-256 of a checkpoint's weight files (what ``ModelScore.model['sha256']`` holds).

    Raises:
        The errors of :func:`open_source`; ``SourceNotFoundError`` for in-memory objects.
    """
    with open_source(ref) as source:
        digest = source.provenance.digest()
        if digest is None:
            raise SourceNotFoundError("in-memory models have no content hash")
        return digest

